//! A one-line summary of what changed between two configs, for the reload log.

use std::collections::BTreeSet;

use crate::config::UpstreamsConfig;

fn hosts(cfg: &UpstreamsConfig) -> BTreeSet<String> {
    cfg.hosts.iter().map(|h| h.name.clone()).collect()
}

fn backends(cfg: &UpstreamsConfig) -> BTreeSet<String> {
    cfg.hosts
        .iter()
        .flat_map(|h| {
            h.paths.iter().flat_map(move |p| {
                p.servers
                    .iter()
                    .map(move |s| format!("{}{} -> {s}", h.name, p.prefix))
            })
        })
        .collect()
}

/// Names listed in full in one part of the line; more are counted. A reload of 30,000 hosts
/// made a 1.4 MB log line, which journald and syslog split or drop.
const LISTED_AT_MOST: usize = 20;

fn list(items: Vec<&String>) -> String {
    if items.is_empty() {
        return "none".into();
    }
    let shown: Vec<&str> = items
        .iter()
        .take(LISTED_AT_MOST)
        .map(|s| s.as_str())
        .collect();
    match items.len().saturating_sub(LISTED_AT_MOST) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// "hosts +[..] -[..]; backends +[..] -[..]", or "no route changes".
pub fn describe(old: &UpstreamsConfig, new: &UpstreamsConfig) -> String {
    let (oh, nh) = (hosts(old), hosts(new));
    let (ob, nb) = (backends(old), backends(new));
    let added_hosts: Vec<_> = nh.difference(&oh).collect();
    let removed_hosts: Vec<_> = oh.difference(&nh).collect();
    let added: Vec<_> = nb.difference(&ob).collect();
    let removed: Vec<_> = ob.difference(&nb).collect();
    if added_hosts.is_empty() && removed_hosts.is_empty() && added.is_empty() && removed.is_empty()
    {
        return "no route changes (policies or headers may have changed)".into();
    }
    format!(
        "hosts added: {}; hosts removed: {}; backends added: {}; backends removed: {}",
        list(added_hosts),
        list(removed_hosts),
        list(added),
        list(removed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lists_are_cut_and_counted() {
        let names: Vec<String> = (0..25).map(|i| format!("h{i}")).collect();
        let listed = list(names.iter().collect());
        assert!(listed.ends_with("h19 and 5 more"), "{listed}");
        assert_eq!(list(names.iter().take(2).collect()), "h0, h1");
        assert_eq!(list(Vec::new()), "none");
    }
}
