//! Unit tests of `acme`.

use super::*;

/// A set never issued has its failed orders counted and no expiry series (its 0 fired
/// expiry alerts); an expired certificate's says 0.
#[test]
fn a_set_without_a_certificate_has_no_expiry_series() {
    let mut stats = BTreeMap::new();
    let failed = SetStats {
        issued: 0,
        failed: 2,
        expires: 0,
    };
    stats.insert("fail.test".to_string(), failed);
    let held = SetStats {
        issued: 1,
        failed: 0,
        expires: 1_000,
    };
    stats.insert("ok.test".to_string(), held);
    let gone = SetStats {
        issued: 1,
        failed: 0,
        expires: 10,
    };
    stats.insert("gone.test".to_string(), gone);
    let mut out = String::new();
    render_stats(&stats, 400, &mut out);
    assert!(
        out.contains("aralez_acme_orders_total{domain=\"fail.test\",result=\"failed\"} 2"),
        "{out}"
    );
    assert!(
        !out.contains("expiry_seconds{domain=\"fail.test\"}"),
        "{out}"
    );
    assert!(
        out.contains("expiry_seconds{domain=\"ok.test\"} 600"),
        "{out}"
    );
    assert!(
        out.contains("expiry_seconds{domain=\"gone.test\"} 0"),
        "{out}"
    );
}

#[test]
fn a_name_of_a_set_is_ordered_with_its_set() {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let sets = vec![names(&["a.test", "www.a.test"]), names(&["b.test"])];
    assert_eq!(
        set_of(sets.clone(), "www.a.test".into()),
        names(&["a.test", "www.a.test"])
    );
    assert_eq!(set_of(sets.clone(), "b.test".into()), names(&["b.test"]));
    assert_eq!(set_of(sets, "c.test".into()), names(&["c.test"]));
}
