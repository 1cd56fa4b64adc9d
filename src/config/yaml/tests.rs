//! Unit tests of `yaml`.

use super::*;

fn map_entries(node: &Node) -> &[(Key, Node)] {
    match &node.value {
        Value::Map(entries) => entries,
        other => panic!("expected a map, got {other:?}"),
    }
}

#[test]
fn numbers_and_booleans_keep_how_they_were_written() {
    let doc = "key: 0123\nhex: 0x10 # c\nyes: on\nno:\n  list: [0777, 1e3]\n\"true\": 1\n0x1F: x\n";
    let root = parse(doc).unwrap();
    let top = map_entries(&root);
    let written = |n: &Node| n.written.as_deref().map(str::to_string);
    assert!(
        !matches!(top[0].1.value, Value::Str(_)),
        "{:?}",
        top[0].1.value
    );
    assert_eq!(written(&top[0].1).as_deref(), Some("0123"));
    assert_eq!(written(&top[1].1).as_deref(), Some("0x10"));
    let names: Vec<&str> = top.iter().map(|(k, _)| k.name.as_str()).collect();
    assert_eq!(names, ["key", "hex", "yes", "no", "true", "0x1F"]);
    assert_eq!(written(&top[2].1).as_deref(), Some("on"));
    match &map_entries(&top[3].1)[0].1.value {
        Value::Seq(items) => {
            let texts: Vec<_> = items.iter().map(written).collect();
            assert_eq!(texts, [Some("0777".into()), Some("1e3".into())]);
        }
        other => panic!("expected a list, got {other:?}"),
    }
}

#[test]
fn keys_and_values_carry_positions() {
    let doc = "a: 1\nb:\n  c: [x, \"y\"]\n  d: true\n";
    let root = parse(doc).unwrap();
    let top = map_entries(&root);
    assert_eq!(top[0].0.name, "a");
    assert_eq!(top[0].0.pos, Pos { line: 1, column: 1 });
    assert!(matches!(top[0].1.value, Value::Int(1)));
    let inner = map_entries(&top[1].1);
    assert_eq!(inner[0].0.name, "c");
    assert_eq!(inner[0].0.pos.line, 3);
    assert_eq!(inner[1].0.pos, Pos { line: 4, column: 3 });
    match &inner[0].1.value {
        Value::Seq(items) => {
            assert_eq!(items.len(), 2);
            assert_eq!(items[1].pos.line, 3);
            assert!(matches!(&items[1].value, Value::Str(s) if s == "y"));
        }
        other => panic!("expected a list, got {other:?}"),
    }
}

#[test]
fn syntax_errors_have_a_line() {
    let err = parse("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
    assert!(err.pos.line >= 2, "{err:?}");
    assert!(!err.message.is_empty());
}

#[test]
fn an_error_without_a_location_points_at_the_start() {
    // Found by the config fuzz target: serde-saphyr gives this error no location.
    let text = "                    11111111111111111111          # threads\nlog_level: info\n";
    let failure = parse(text).expect_err("refused");
    assert!(
        failure.pos.line >= 1 && failure.pos.column >= 1,
        "{failure:?}"
    );
}

#[test]
fn alias_bomb_is_refused() {
    let mut doc = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let mut prev = 'a';
    for name in 'b'..='j' {
        doc.push_str(&format!("{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
        prev = name;
    }
    assert!(parse(&doc).is_err());
}

#[test]
fn unclosed_flow_collection_is_named() {
    let err = parse("a: 1\nb: [x, \"y]\"\nc: 3\n").unwrap_err();
    assert!(err.message.contains("`[` on line 2"), "{err:?}");
    let err = parse("a: {x: 1 # }\nb: 2\n").unwrap_err();
    assert!(err.message.contains("`{` on line 1"), "{err:?}");
}

#[test]
fn duplicate_keys_are_refused() {
    let err = parse("a: 1\na: 2\n").unwrap_err();
    assert_eq!(err.pos.line, 2, "{err:?}");
}

/// Where the key before the failure may not be the one at fault, none is named.
#[test]
fn a_parse_failure_names_only_a_key_it_can_be_sure_of() {
    let key = |line: &str, column: u32| key_on_line(line, Pos { line: 1, column });
    assert_eq!(key("  threads: .inf", 12).as_deref(), Some("threads"));
    assert_eq!(key("- - name: @x", 11).as_deref(), Some("name"));
    assert_eq!(key("\"a: b\": @", 9).as_deref(), Some("a: b"));
    assert_eq!(key("'/:x': @", 8).as_deref(), Some("/:x"));
    // A `key:` inside a quoted value an earlier line opened is text, not a key.
    let text = "a:\n  redirect_to: \"http://x\n    to_https: true\" x\n";
    assert_eq!(
        key_on_line(
            text,
            Pos {
                line: 3,
                column: 20
            }
        ),
        None
    );
    let text = "a: 'it''s'\nb: \"it's\" # \"\nc: @\n";
    assert_eq!(
        key_on_line(text, Pos { line: 3, column: 4 }).as_deref(),
        Some("c")
    );
    for (line, column) in [
        ("\"X-B: 2\" ]]", 10),
        ("a.test: {paths: {\"/\": 1, \"/x\": [}", 33),
        ("\"/\": { servers: [1], bad: : }", 26),
        ("'single ''q'' key': @", 20),
        ("!!str b.test: @", 15),
        ("x: [", 5),
    ] {
        assert_eq!(key(line, column), None, "{line}");
    }
}

#[test]
fn a_non_finite_number_names_its_key_and_says_what_to_write() {
    for (doc, key) in [
        ("threads: .inf\n", "threads"),
        ("a:\n  - weight: -.INF\n", "weight"),
        ("a:\n  \"max_body\": .nan\n", "max_body"),
    ] {
        let err = parse(doc).unwrap_err();
        assert_eq!(err.key.as_deref(), Some(key), "{doc:?}: {err:?}");
        assert!(err.message.contains("not a finite number"), "{err:?}");
        assert!(!err.message.contains("policy"), "{err:?}");
    }
}
