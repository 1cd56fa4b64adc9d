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

fn list(items: Vec<&String>) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items
            .into_iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
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
