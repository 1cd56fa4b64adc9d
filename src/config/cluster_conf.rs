//! main.yaml's keys for several instances run as one (SPEC §14): Aralez 0.95's cluster mode
//! (`cluster_member: master|worker`, `worker_nodes`) and ours, `limits_store`. Only parsing and
//! validation live here; the push is `control::cluster`, the shared limits
//! `layers::shared_limits`.

use std::net::{IpAddr, SocketAddr};

use super::reader::Reader;
use super::yaml::{Node, Pos, Value};

/// What an instance is in a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Member {
    /// No `cluster_member`: an instance on its own.
    #[default]
    Alone,
    /// Serves no proxy traffic; pushes every accepted configuration to `worker_nodes`.
    Master,
    /// An ordinary instance (the master pushes to its admin API).
    Worker,
}

/// The cluster keys of main.yaml.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    pub member: Member,
    /// The workers' admin APIs (`http://host:port`, `https://host:port`).
    pub worker_nodes: Vec<String>,
    /// `redis://host:port[/db]`: where `rate_limit` and `x4xx_limit` are counted across instances.
    pub limits_store: Option<String>,
    /// Where `cluster_member` was written, for the checks that involve other keys.
    pub member_pos: Option<Pos>,
    /// Where `worker_nodes` is written (valid or not).
    pub worker_nodes_at: Option<Pos>,
    /// `worker_nodes` is written, valid, and lists nobody (`[]`).
    pub worker_nodes_listed_none: bool,
}

impl ClusterConfig {
    /// Reads `key` if it is one of the cluster keys; `None` when it is not, else whether it
    /// was read.
    pub fn read(&mut self, key: &str, node: &Node, r: &mut Reader) -> Option<bool> {
        let read = match key {
            "cluster_member" => read_member(node, key, r).map(|m| {
                self.member = m;
                self.member_pos = Some(node.pos);
            }),
            "worker_nodes" => {
                self.worker_nodes_at = Some(node.pos);
                read_nodes(node, key, r).map(|n| {
                    self.worker_nodes_listed_none = n.is_empty();
                    self.worker_nodes = n;
                })
            }
            "limits_store" => read_store(node, key, r).map(|s| self.limits_store = Some(s)),
            _ => return None,
        };
        Some(read.is_some())
    }

    /// A master needs workers to push to, the master key (`master_key` or `JWT_KEY`) to push
    /// with and the config API on (as its workers do, to be pushed to); `own_admin` are its
    /// own admin API's addresses, which a worker's URL should not name.
    pub fn check(
        &self,
        has_master_key: bool,
        config_api: bool,
        own_admin: &[SocketAddr],
        r: &mut Reader,
    ) -> bool {
        let Some(pos) = self.member_pos else {
            return true;
        };
        let off = "the config API is off (config_api_enabled: false)";
        match self.member {
            Member::Worker => {
                if !config_api {
                    let why =
                        format!("a worker takes the master's pushes through POST /conf, and {off}");
                    r.warn(pos, "cluster_member", why);
                }
                if let Some(at) = self.worker_nodes_at {
                    r.warn(
                        at,
                        "worker_nodes",
                        "a worker pushes to nobody: only a master's worker_nodes are used",
                    );
                }
                return true;
            }
            Member::Master => {}
            _ => return true,
        }
        let mut ok = true;
        if !config_api {
            r.error(
                pos,
                "cluster_member",
                format!("a master takes configurations through POST /conf, and {off}"),
            );
            ok = false;
        }
        // Written but wrong is said at the entries themselves; written empty, at the key.
        if self.worker_nodes.is_empty() && self.worker_nodes_at.is_none() {
            let why = "a master needs `worker_nodes` (the workers' admin APIs, e.g. \"http://10.0.0.2:3000, http://10.0.0.3:3000\")";
            r.error(pos, "cluster_member", why);
            ok = false;
        }
        if let (true, Some(at)) = (self.worker_nodes_listed_none, self.worker_nodes_at) {
            let why = "lists no worker: a master would push to nobody and serve no proxy traffic";
            r.error(at, "worker_nodes", why);
            ok = false;
        }
        if !has_master_key {
            let why = "a master needs `master_key` or `JWT_KEY` (it pushes configurations to the workers with it)";
            r.error(pos, "cluster_member", why);
            ok = false;
        }
        let at = self.worker_nodes_at.unwrap_or(pos);
        for url in self
            .worker_nodes
            .iter()
            .filter(|u| names_own_admin(u, own_admin))
        {
            let why = format!("`{url}` is this master's own admin API: a push to itself is taken once and not passed on; list the workers only");
            r.warn(at, "worker_nodes", why);
        }
        ok
    }
}

/// Whether the worker URL `url` (valid) names one of `own` (the admin API's addresses): the
/// same port, and the same IP address, or a loopback one (`localhost` too) where `own` is
/// loopback or every address. Other host names are not resolved.
fn names_own_admin(url: &str, own: &[SocketAddr]) -> bool {
    let authority = url.split_once("://").map_or(url, |(_, a)| a);
    let Ok(authority) = authority.parse::<http::uri::Authority>() else {
        return false;
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) if host.eq_ignore_ascii_case("localhost") => None,
        Err(_) => return false,
    };
    let port = authority.port_u16();
    own.iter().any(|addr| {
        let local = addr.ip().is_loopback() || addr.ip().is_unspecified();
        port == Some(addr.port())
            && match ip {
                Some(ip) => ip == addr.ip() || (ip.is_loopback() && local),
                None => local,
            }
    })
}

fn read_member(node: &Node, key: &str, r: &mut Reader) -> Option<Member> {
    let text = r.non_empty_string(node, key)?;
    match text.trim().to_ascii_lowercase().as_str() {
        "master" => Some(Member::Master),
        "worker" => Some(Member::Worker),
        _ => {
            r.error(node.pos, key, format!("`{text}` is not master or worker"));
            None
        }
    }
}

/// Aralez's form, one string of comma-separated URLs, or a list of them.
fn read_nodes(node: &Node, key: &str, r: &mut Reader) -> Option<Vec<String>> {
    let mut ok = true;
    let items: Vec<(Pos, String, String)> = match &node.value {
        Value::Seq(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let item_key = format!("{key}[{i}]");
                let text = r.non_empty_string(n, &item_key);
                ok &= text.is_some();
                text.map(|s| (n.pos, item_key, s))
            })
            .collect(),
        _ => {
            let text = r.non_empty_string(node, key)?;
            text.split(',')
                .map(|s| (node.pos, key.to_string(), s.to_string()))
                .collect()
        }
    };
    let mut nodes: Vec<String> = Vec::with_capacity(items.len());
    // Every bad entry is said, not the first only.
    for (pos, item_key, item) in items {
        let url = item.trim().trim_end_matches('/');
        match worker_url_problem(url) {
            Some(why) => {
                r.error(pos, &item_key, why);
                ok = false;
            }
            None if nodes.iter().any(|n| n == url) => r.warn(
                pos,
                &item_key,
                format!("`{url}` is listed twice (pushed to once)"),
            ),
            None => nodes.push(url.to_string()),
        }
    }
    ok.then_some(nodes)
}

/// What is wrong with a worker's URL, if anything: it must be `http://host:port` or
/// `https://host:port`, whose host and port a connection can use. Credentials are refused
/// without repeating them: they would be sent nowhere and shown in every log line that names
/// the worker.
fn worker_url_problem(url: &str) -> Option<String> {
    let not_one = || {
        Some(format!(
            "`{url}` is not http://host:port or https://host:port"
        ))
    };
    let Some(authority) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return not_one();
    };
    if authority.contains('@') {
        return Some("the URL carries credentials, which are never sent: the master's pushes carry master_key".into());
    }
    if authority.is_empty() || authority.contains(['/', '?', '#']) {
        return not_one();
    }
    match authority.parse::<http::uri::Authority>() {
        Ok(a) if a.host().is_empty() => not_one(),
        Ok(a) if !super::values::port_in_range(&a) => {
            Some(format!("`{url}`: the port is out of range (1-65535)"))
        }
        Ok(_) => None,
        Err(_) => not_one(),
    }
}

fn read_store(node: &Node, key: &str, r: &mut Reader) -> Option<String> {
    let text = r.non_empty_string(node, key)?;
    let url = text.trim();
    match super::values::check_redis_url(url) {
        Ok(()) => {
            // Past Redis's 16 databases (unless its `databases` says more) every command fails
            // ("DB index is out of range") and the limits stay per instance for good.
            let db = super::values::redis_db(url).and_then(|db| db.parse::<u32>().ok());
            if db.is_some_and(|n| n > 15) {
                let why = "names a database past 15: Redis has 16 (0-15) unless its `databases` says more";
                r.warn(node.pos, key, why);
            }
            Some(url.to_string())
        }
        Err(why) => {
            r.error(node.pos, key, why);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::issues::Issues;
    use crate::config::yaml;

    fn read(text: &str, master_key: bool) -> (ClusterConfig, bool, Issues) {
        let mut issues = Issues::default();
        let root = yaml::parse(text).expect("yaml");
        let mut cfg = ClusterConfig::default();
        let mut ok = true;
        {
            let mut r = Reader::new("main.yaml".into(), &mut issues);
            if let Value::Map(entries) = &root.value {
                for (key, node) in entries {
                    ok &= cfg.read(&key.name, node, &mut r) == Some(true);
                }
            }
            let own: SocketAddr = ([127, 0, 0, 1], 3000).into();
            ok &= cfg.check(master_key, true, &[own], &mut r);
        }
        (cfg, ok, issues)
    }

    #[test]
    fn a_master_names_its_workers_and_has_the_master_key() {
        let text =
            "cluster_member: master\nworker_nodes: \"http://127.0.0.1:3001, https://w2:3000/\"\n";
        let (cfg, ok, _) = read(text, true);
        assert!(ok);
        assert_eq!(cfg.member, Member::Master);
        assert_eq!(
            cfg.worker_nodes,
            ["http://127.0.0.1:3001", "https://w2:3000"]
        );
        let (_, ok, issues) = read(text, false);
        assert!(!ok);
        let error = issues.errors().next().expect("an error");
        assert_eq!((error.line, error.key.as_str()), (1, "cluster_member"));
        assert!(error.message.contains("master_key"), "{}", error.message);
        let (_, ok, issues) = read("cluster_member: master\n", true);
        assert!(!ok && issues.errors().any(|e| e.message.contains("worker_nodes")));
    }

    #[test]
    fn a_worker_url_naming_the_masters_own_admin_api_is_warned_of() {
        let text = "cluster_member: master\nworker_nodes: \"http://localhost:3000, http://[::1]:3000, http://127.0.0.1:3001, http://w:3000\"\n";
        let (_, ok, issues) = read(text, true);
        assert!(ok, "{issues:?}");
        let warned: Vec<_> = issues.warnings().map(|w| w.message.clone()).collect();
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(warned[0].contains("`http://localhost:3000` is this master's own admin API"));
        assert!(warned[1].contains("`http://[::1]:3000`"), "{warned:?}");
        let every: SocketAddr = ([0, 0, 0, 0], 3000).into();
        assert!(names_own_admin("http://127.0.0.2:3000", &[every]));
        assert!(!names_own_admin("http://10.0.0.2:3000", &[every]));
        let one: SocketAddr = ([10, 0, 0, 2], 3000).into();
        assert!(names_own_admin("https://10.0.0.2:3000", &[one]));
        assert!(!names_own_admin("http://localhost:3000", &[one]));
    }

    #[test]
    fn every_bad_worker_is_said_and_nothing_claims_worker_nodes_is_missing() {
        let text = "cluster_member: master\nworker_nodes: \"127.0.0.1:1, ftp://x, http://\"\n";
        let (_, ok, issues) = read(text, true);
        assert!(!ok);
        let said: Vec<_> = issues.errors().map(|e| e.message.clone()).collect();
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(
            !said.iter().any(|m| m.contains("needs `worker_nodes`")),
            "{said:?}"
        );
        let text = "cluster_member: master\nworker_nodes: \"http://a:1, http://a:1/\"\nlimits_store: \"redis://r:6379/99\"\n";
        let (cfg, ok, issues) = read(text, true);
        assert!(ok, "{issues:?}");
        assert_eq!(cfg.worker_nodes, ["http://a:1"]);
        let warned: Vec<_> = issues.warnings().map(|w| w.message.clone()).collect();
        assert!(
            warned.iter().any(|m| m.contains("listed twice")),
            "{warned:?}"
        );
        assert!(warned.iter().any(|m| m.contains("past 15")), "{warned:?}");
    }

    #[test]
    fn bad_values_are_named() {
        for (text, says) in [
            ("cluster_member: boss\n", "not master or worker"),
            ("worker_nodes: \"ftp://x:1\"\n", "not http://host:port"),
            (
                "worker_nodes: [\"http://a:1/conf\"]\n",
                "not http://host:port",
            ),
            ("limits_store: \"memcached://x\"\n", "not redis://"),
            (
                "limits_store: \"redis://127.0.0.1:99999\"\n",
                "not a Redis URL",
            ),
            (
                "limits_store: \"redis://127.0.0.1:6379/abc\"\n",
                "not a Redis URL",
            ),
        ] {
            let (_, ok, issues) = read(text, true);
            assert!(!ok, "{text}");
            assert!(issues.errors().any(|e| e.message.contains(says)), "{text}");
        }
        let (cfg, ok, _) = read(
            "limits_store: \"redis://127.0.0.1:6379/2\"\ncluster_member: worker\n",
            false,
        );
        assert!(ok);
        assert_eq!(
            cfg.limits_store.as_deref(),
            Some("redis://127.0.0.1:6379/2")
        );
        assert_eq!(cfg.member, Member::Worker);
    }
}
