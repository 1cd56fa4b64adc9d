//! Configuration: `main.yaml`, `upstreams.yaml` and `conf.d/*.yaml` -> typed, validated config.
//!
//! Reading never panics and never stops at the first problem: every issue is collected with its
//! file, line, column and key. No I/O happens here beyond reading the files themselves.

pub mod acme_conf;
pub mod across;
pub mod cache_conf;
pub mod cluster_conf;
pub mod discovery_conf;
mod exists;
pub mod file_bytes;
mod host_name;
pub mod issues;
mod listeners;
pub mod log_conf;
pub mod main_conf;
mod main_values;
pub mod net_conf;
mod reader;
pub mod settings;
pub mod upstreams;
pub mod values;
pub mod yaml;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use issues::{Issue, Issues, Severity};
pub use main_conf::MainConfig;
pub use upstreams::{Shape, UpstreamsConfig};

use file_bytes::{io_reason, FileProblem};
use reader::Reader;
use yaml::{Node, Pos};

/// Reads and parses one YAML file into a spanned tree, recording why when it cannot.
fn read_tree(path: &Path, issues: &mut Issues) -> Option<Node> {
    read_tree_digested(path, issues, &mut DefaultHasher::new())
}

/// [`read_tree`], hashing into `digest` the bytes it parses (nothing when it cannot read them),
/// as [`files_digest`] hashes a file.
fn read_tree_digested(
    path: &Path,
    issues: &mut Issues,
    digest: &mut DefaultHasher,
) -> Option<Node> {
    let file: Arc<str> = Arc::from(path.display().to_string());
    let mut r = Reader::new(file, issues);
    let start = Pos { line: 1, column: 1 };
    let bytes = match file_bytes::read_regular(path, yaml::MAX_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(FileProblem::Directory) => {
            r.error(start, "(file)", "is a directory, not a YAML file");
            return None;
        }
        Err(FileProblem::Io(e)) => {
            r.error(start, "(file)", format!("cannot read: {}", io_reason(&e)));
            return None;
        }
        Err(problem) => {
            r.error(start, "(file)", problem.to_string());
            return None;
        }
    };
    bytes.hash(digest);
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let line = e.as_bytes()[..offset]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1;
            let line_start = e.as_bytes()[..offset]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&e.as_bytes()[line_start..offset])
                .chars()
                .count()
                + 1;
            let pos = Pos {
                line: u32::try_from(line).unwrap_or(u32::MAX),
                column: u32::try_from(column).unwrap_or(u32::MAX),
            };
            let byte = e.as_bytes()[offset];
            r.error(
                pos,
                "(file)",
                format!("file is not valid UTF-8 (byte 0x{byte:02x}); save it as UTF-8"),
            );
            return None;
        }
    };
    parse_tree(&text, &mut r)
}

fn parse_tree(text: &str, r: &mut Reader) -> Option<Node> {
    match yaml::parse(text) {
        Ok(node) => Some(node),
        Err(failure) => {
            let key = failure.key.as_deref().unwrap_or("(yaml)");
            r.error(
                failure.pos,
                key,
                format!("invalid YAML: {}", failure.message),
            );
            None
        }
    }
}

/// Reads main.yaml.
pub fn load_main(path: &Path, issues: &mut Issues) -> Option<MainConfig> {
    let (cfg, valid) = load_main_as_far_as_valid(path, issues)?;
    valid.then_some(cfg)
}

/// [`load_main`], and what a main.yaml with errors says all the same, with `false`
/// ([`MainConfig::read_as_far_as_valid`]).
pub fn load_main_as_far_as_valid(path: &Path, issues: &mut Issues) -> Option<(MainConfig, bool)> {
    let root = read_tree(path, issues)?;
    let mut r = Reader::new(Arc::from(path.display().to_string()), issues);
    MainConfig::read_as_far_as_valid(&root, path, &mut r)
}

/// Reads upstreams.yaml and merges `conf.d/*.yaml` beside it, in name order (SPEC §3.5).
/// Whether JWT rules without `data` have a secret: `JWT_KEY` (not empty) or `master_key`, as
/// the keys built at start read them.
pub fn master_secret_set(main: &MainConfig) -> bool {
    main.master_key.is_some() || std::env::var("JWT_KEY").is_ok_and(|k| !k.is_empty())
}

pub fn load_upstreams(path: &Path, issues: &mut Issues) -> Option<UpstreamsConfig> {
    load_upstreams_digested(path, issues).map(|(cfg, _)| cfg)
}

/// [`load_upstreams`], with the [`files_digest`] of the very bytes it parsed: a file replaced
/// between a digest and a read cannot pair one file's digest with another's routes.
pub fn load_upstreams_digested(path: &Path, issues: &mut Issues) -> Option<(UpstreamsConfig, u64)> {
    let mut digest = DefaultHasher::new();
    let root = read_tree_digested(path, issues, &mut digest)?;
    let mut r = Reader::new(Arc::from(path.display().to_string()), issues);
    let mut cfg = UpstreamsConfig::read(&root, &mut r)?;
    let merged = merge_conf_d(&mut cfg, path, issues, &mut digest);
    if cfg.hosts.is_empty() && is_blank(path) {
        // A failed template render (`envsubst > upstreams.yaml`) or a full disk; beside
        // conf.d's hosts an empty file is how a conf.d-only setup looks, and routes those.
        let mut r = Reader::new(Arc::from(path.display().to_string()), issues);
        let start = Pos { line: 1, column: 1 };
        let why = "the file is empty: no route, every request gets 404 (write `upstreams: {}` \
                   to mean it; a reload of an empty file is refused)";
        r.warn(start, "(file)", why);
    }
    merged.then(|| (cfg, digest.finish()))
}

/// Merges the `conf.d` files beside `upstreams` into `cfg` (SPEC §3.5), hashing their names
/// and bytes into `digest` as [`files_digest`] does; false if one of them fails.
fn merge_conf_d(
    cfg: &mut UpstreamsConfig,
    upstreams: &Path,
    issues: &mut Issues,
    digest: &mut DefaultHasher,
) -> bool {
    let mut ok = true;
    for file in conf_d_files(upstreams) {
        file.hash(&mut *digest);
        let Some(root) = read_tree_digested(&file, issues, digest) else {
            ok = false;
            continue;
        };
        let mut r = Reader::new(Arc::from(file.display().to_string()), issues);
        ok &= cfg.merge_conf_d(&root, &mut r);
    }
    ok
}

/// Whether the file at `path` holds no YAML at all: nothing, blank lines or comments only (an
/// unreadable file is not blank: its reading says why).
pub fn is_blank(path: &Path) -> bool {
    file_bytes::read_regular(path, yaml::MAX_FILE_BYTES).is_ok_and(|bytes| is_blank_text(&bytes))
}

/// Whether `text` says nothing: blank lines and comments, or a template's leftovers around
/// nothing (`---`, `...`, a lone `~` or `null`, `upstreams:` with no value). Such a file parses
/// to no route at all, as an empty one does.
pub fn is_blank_text(text: &[u8]) -> bool {
    text.split(|&b| b == b'\n').all(says_nothing)
}

/// Whether `text` says in so many words that nothing is routed: a line `upstreams: {}`.
pub fn says_no_routes(text: &[u8]) -> bool {
    text.split(|&b| b == b'\n').any(|line| {
        let line = without_comment(line);
        let Some(value) = line.strip_prefix(b"upstreams:") else {
            return false;
        };
        let inside = value
            .trim_ascii()
            .strip_prefix(b"{")
            .and_then(|v| v.strip_suffix(b"}"));
        inside.is_some_and(|i| i.trim_ascii().is_empty())
    })
}

/// `line` trimmed, without its comment: one starts the line or follows a blank (`a#b` is a
/// value).
fn without_comment(line: &[u8]) -> &[u8] {
    let line = line.trim_ascii();
    match line.iter().position(|&b| b == b'#') {
        Some(0) => &[],
        Some(at) if line[at - 1].is_ascii_whitespace() => line[..at].trim_ascii(),
        _ => line,
    }
}

/// A line of [`is_blank_text`]'s: empty once its comment is gone, or one of the leftovers.
fn says_nothing(line: &[u8]) -> bool {
    let line = without_comment(line);
    let line = [&b"---"[..], b"..."]
        .iter()
        .find_map(|marker| line.strip_prefix(*marker))
        .map_or(line, <[u8]>::trim_ascii);
    let line = line
        .strip_prefix(b"upstreams:")
        .map_or(line, <[u8]>::trim_ascii);
    matches!(line, b"" | b"~" | b"null" | b"Null" | b"NULL")
}

/// What identifies the upstreams file and conf.d as they are on disk: file names and bytes,
/// hashed the way [`load_upstreams_digested`] hashes what it parses.
pub fn files_digest(upstreams: &Path) -> u64 {
    let read =
        |path: &Path| file_bytes::read_regular(path, yaml::MAX_FILE_BYTES).unwrap_or_default();
    let mut digest = DefaultHasher::new();
    read(upstreams).hash(&mut digest);
    for file in conf_d_files(upstreams) {
        file.hash(&mut digest);
        read(&file).hash(&mut digest);
    }
    digest.finish()
}

/// Parses upstreams YAML handed over in memory (the admin API), named `origin` in issues.
pub fn parse_upstreams_text(
    text: &str,
    origin: &str,
    issues: &mut Issues,
) -> Option<UpstreamsConfig> {
    let mut r = Reader::new(Arc::from(origin), issues);
    let root = parse_tree(text, &mut r)?;
    UpstreamsConfig::read(&root, &mut r)
}

/// [`parse_upstreams_text`] in place of the file at `upstreams`, with the `conf.d` files
/// beside it merged as a load of that file merges them (SPEC §3.5): what `POST /conf` serves
/// is what the same text saved there would.
pub fn parse_upstreams_text_beside(
    text: &str,
    origin: &str,
    upstreams: &Path,
    issues: &mut Issues,
) -> Option<UpstreamsConfig> {
    let mut cfg = parse_upstreams_text(text, origin, issues)?;
    merge_conf_d(&mut cfg, upstreams, issues, &mut DefaultHasher::new()).then_some(cfg)
}

/// Parses main.yaml text held in memory as if read from `path` (relative paths in it are taken
/// from beside `path`; nothing is read from disk).
pub fn parse_main_text(text: &str, path: &Path, issues: &mut Issues) -> Option<MainConfig> {
    let mut r = Reader::new(Arc::from(path.display().to_string()), issues);
    let root = parse_tree(text, &mut r)?;
    MainConfig::read(&root, path, &mut r)
}

/// The upstreams file to read: `main`'s, or when main.yaml has errors, where its YAML alone
/// says (so errors in main.yaml do not hide those of the routes). `None` when it cannot say.
pub fn upstreams_conf_of(main: Option<&MainConfig>, main_path: &Path) -> Option<PathBuf> {
    match main {
        Some(main) => Some(main.upstreams_conf.clone()),
        None => upstreams_conf_in(main_path).filter(|p| p.is_file()),
    }
}

/// Where main.yaml points `upstreams_conf`, read from its YAML alone (the rest of it may be
/// broken) and resolved like `upstreams_conf`.
fn upstreams_conf_in(main_path: &Path) -> Option<PathBuf> {
    let bytes = file_bytes::read_regular(main_path, yaml::MAX_FILE_BYTES).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let parsed = yaml::parse(text);
    let written = match &parsed {
        Ok(root) => {
            let yaml::Value::Map(entries) = &root.value else {
                return None;
            };
            let (_, node) = entries.iter().find(|(k, _)| k.name == "upstreams_conf")?;
            let yaml::Value::Str(written) = &node.value else {
                return None;
            };
            written.as_str()
        }
        // A file that does not parse (a duplicate key, a tab) still says it on a line.
        Err(_) => upstreams_conf_on_a_line(text)?,
    };
    let beside = main_path.parent().unwrap_or(Path::new(".")).join(written);
    let as_written = PathBuf::from(written);
    Some(if beside.exists() || !as_written.exists() {
        beside
    } else {
        as_written
    })
}

/// The lines that set `key` at the top level of a YAML text, read as text (quoted or not):
/// each one's number from 1, and what follows its colon. For files that do not parse, and for
/// positions the parsed tree does not keep.
pub fn top_level_key_lines<'a>(
    text: &'a str,
    key: &'a str,
) -> impl Iterator<Item = (u32, &'a str)> + 'a {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines().zip(1u32..).filter_map(move |(line, number)| {
        let quoted = ['"', '\'']
            .iter()
            .find_map(|q| line.strip_prefix(*q)?.strip_prefix(key)?.strip_prefix(*q));
        let rest = quoted.or_else(|| line.strip_prefix(key))?;
        Some((number, rest.trim_start().strip_prefix(':')?))
    })
}

/// The value of a top-level `upstreams_conf:` line written plainly (once, unquoted or quoted
/// without escapes), for a main.yaml that does not parse as YAML.
fn upstreams_conf_on_a_line(text: &str) -> Option<&str> {
    let mut values = top_level_key_lines(text, "upstreams_conf").filter_map(|(_, value)| {
        let comment = value
            .char_indices()
            .find(|&(i, c)| c == '#' && value[..i].ends_with([' ', '\t']));
        let value = comment.map_or(value, |(i, _)| &value[..i]).trim();
        let unquoted = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        let plain = !unquoted.is_empty() && !unquoted.contains(['"', '\'', '\\', '{', '[']);
        Some(unquoted).filter(|_| plain)
    });
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

/// `conf.d/*.yaml` beside `upstreams`, sorted by name.
pub fn conf_d_files(upstreams: &Path) -> Vec<PathBuf> {
    let dir = upstreams.parent().unwrap_or(Path::new(".")).join("conf.d");
    let Ok(read) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = read
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        // A shell's `*.yaml` leaves dotfiles out (an editor's or a generator's temporary file
        // would be merged half-written).
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
        })
        // A link is kept even when it leads nowhere: reading it fails, and the load with it
        // (nginx's include fails on an entry it cannot open), instead of its hosts vanishing.
        .filter(|p| p.is_file() || p.symlink_metadata().is_ok_and(|m| m.is_symlink()))
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "upstreams:\n  a.example:\n    paths:\n      \"/\":\n        servers: [\"127.0.0.1:8000\"]\n";
    const B: &str = "upstreams:\n  b.example:\n    paths:\n      \"/\":\n        servers: [\"127.0.0.1:8001\"]\n";
    /// A conf.d file holds hosts at its top level.
    const EXTRA: &str = "c.example:\n  paths:\n    \"/\":\n      servers: [\"127.0.0.1:8002\"]\n";

    #[test]
    fn a_conf_d_host_replacing_one_of_the_file_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upstreams.yaml");
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        std::fs::write(&path, A).unwrap();
        let again = "a.example:\n  paths:\n    \"/\":\n      servers: [\"127.0.0.1:8009\"]\n";
        std::fs::write(dir.path().join("conf.d/a.yaml"), again).unwrap();
        let mut issues = Issues::default();
        let cfg = load_upstreams(&path, &mut issues).expect("loads");
        assert_eq!(cfg.hosts.len(), 1);
        let said: Vec<String> = issues.warnings().map(|w| w.to_string()).collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("host `a.example` replaces the one"),
            "{said:?}"
        );
    }

    #[test]
    fn x_keys_keep_anchors_and_are_no_hosts() {
        let text = format!("x-common: &common\n  servers: [\"127.0.0.1:8000\"]\n{A}  b.example:\n    paths:\n      \"/\":\n        <<: *common\n");
        let mut issues = Issues::default();
        let cfg = parse_upstreams_text(&text, "upstreams.yaml", &mut issues).expect("loads");
        assert_eq!(issues.warnings().count(), 0, "{issues:?}");
        let names: Vec<&str> = cfg.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a.example", "b.example"]);
    }

    #[test]
    fn a_conf_d_file_written_as_an_upstreams_file_is_told_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upstreams.yaml");
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        std::fs::write(&path, A).unwrap();
        let wrapped = format!("upstreams:\n  {}", EXTRA.replace('\n', "\n  "));
        std::fs::write(dir.path().join("conf.d/c.yaml"), wrapped).unwrap();
        let mut issues = Issues::default();
        assert!(load_upstreams(&path, &mut issues).is_none());
        let said: Vec<String> = issues.errors().map(|e| e.to_string()).collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("drop the `upstreams:` wrapper"),
            "{said:?}"
        );
    }

    #[test]
    fn a_template_that_rendered_nothing_is_blank() {
        for text in [
            "",
            "\n# nothing\n",
            "---\n",
            "--- # rendered nothing\n",
            "~\n",
            "null",
            "---\n...\n",
            "--- ~\n",
            "upstreams:\n",
            "upstreams: ~ # none\r\n",
            "upstreams: null\n",
        ] {
            assert!(is_blank_text(text.as_bytes()), "{text:?}");
        }
        for text in ["upstreams: {}\n", A, "a#b\n", "--- x\n", "upstreams: ~x\n"] {
            assert!(!is_blank_text(text.as_bytes()), "{text:?}");
        }
        for text in ["upstreams: {}\n", "# none\nupstreams: { } # meant\n"] {
            assert!(says_no_routes(text.as_bytes()), "{text:?}");
        }
        for text in ["{}\n", "upstreams: ~\n", "foo.example: ~\n", A] {
            assert!(!says_no_routes(text.as_bytes()), "{text:?}");
        }
    }

    #[test]
    fn a_conf_d_link_leading_nowhere_fails_the_load_and_dotfiles_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upstreams.yaml");
        let conf_d = dir.path().join("conf.d");
        std::fs::create_dir(&conf_d).unwrap();
        std::fs::write(&path, A).unwrap();
        std::fs::write(conf_d.join(".half-written.yaml"), "c.example: [").unwrap();
        std::os::unix::fs::symlink("../moved/b.yaml", conf_d.join("b.yaml")).unwrap();
        assert_eq!(conf_d_files(&path), [conf_d.join("b.yaml")]);
        let mut issues = Issues::default();
        assert!(load_upstreams(&path, &mut issues).is_none());
        let error = issues.errors().next().expect("an error");
        assert!(error.file.ends_with("b.yaml"), "{error}");
    }

    #[test]
    fn the_digest_of_a_load_is_that_of_the_bytes_it_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upstreams.yaml");
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        std::fs::write(dir.path().join("conf.d/extra.yaml"), EXTRA).unwrap();
        std::fs::write(&path, A).unwrap();
        let mut issues = Issues::default();
        let loaded = load_upstreams_digested(&path, &mut issues);
        let (cfg, digest) =
            loaded.unwrap_or_else(|| panic!("{:?}", issues.errors().collect::<Vec<_>>()));
        assert!(!issues.has_errors());
        assert!(cfg.hosts.iter().any(|h| h.name == "a.example"));
        assert!(cfg.hosts.iter().any(|h| h.name == "c.example"));
        assert_eq!(
            digest,
            files_digest(&path),
            "the same files, the same digest"
        );
        std::fs::write(&path, B).unwrap();
        assert_ne!(digest, files_digest(&path));
        std::fs::write(&path, A).unwrap();
        assert_eq!(digest, files_digest(&path));
    }
}
