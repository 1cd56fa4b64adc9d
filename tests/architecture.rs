//! The shape of `src/`: imports run one way along the request flow, and no module imports itself
//! back through others. Reads every `crate::` and `super::` path in the sources (comments and
//! string literals left out) and fails on an upward arrow between top-level modules or on a cycle
//! among the files of `src/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom up: a module may import only modules of a lower rank.
/// The data path runs server -> routing -> layers -> proxy -> upstream -> vocab; `config`,
/// `metrics` and `accesslog` are leaves beside it (`config` above `vocab`: routes are read in
/// the form requests are normalised to); the control plane and `process` sit above.
const RANKS: &[(&str, u8)] = &[
    ("vocab", 0),
    ("config", 1),
    ("utc", 0),
    ("allocator", 0),
    ("metrics", 2),
    ("logfile", 2),
    ("accesslog", 3),
    ("upstream", 4),
    ("proxy", 5),
    ("layers", 6),
    ("routing", 7),
    ("server", 8),
    ("tls", 9),
    ("fileserver", 9),
    ("control", 9),
    ("discovery", 10),
    ("admin", 11),
    ("check", 11),
    ("process", 12),
];

/// `src/a/b.rs` -> `a::b`, `src/a/mod.rs` -> `a`; `None` for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    let name = parts.join("::");
    (name != "lib" && name != "main").then_some(name)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and string literals (paths in them are not imports).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The modules (as `a` or `a::b`) a file's code names through `crate::` and `super::`.
fn imports(
    module: &str,
    is_mod_rs: bool,
    code: &str,
    known: &BTreeSet<String>,
) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let parent: Vec<&str> = {
        let mut p: Vec<&str> = module.split("::").collect();
        if !is_mod_rs {
            p.pop();
        }
        p
    };
    for (start, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        let before = code[..start].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[start..];
        let (mut base, path) = if let Some(path) = rest.strip_prefix("crate::") {
            (Vec::new(), path)
        } else {
            (parent.clone(), &rest["super::".len()..])
        };
        let segments: Vec<&str> = path
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .next()
            .unwrap_or("")
            .split("::")
            .filter(|s| !s.is_empty())
            .collect();
        // The longest known module the path names.
        let mut best = None;
        for segment in segments {
            base.push(segment);
            let candidate = base.join("::");
            if known.contains(&candidate) {
                best = Some(candidate);
            } else {
                break;
            }
        }
        if let Some(target) = best {
            found.insert(target);
        }
        // `use crate::{a, b::c}`: each braced name that is a module.
        if let Some(list) = path.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(0)];
            for item in list.split(',') {
                let name = item.trim().split("::").next().unwrap_or("");
                let mut target = if rest.starts_with("crate::") {
                    Vec::new()
                } else {
                    parent.clone()
                };
                target.push(name);
                let target = target.join("::");
                if known.contains(&target) {
                    found.insert(target);
                }
            }
        }
    }
    found.remove(module);
    found
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn read_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: Vec<(String, PathBuf)> = files
        .iter()
        .filter_map(|f| module_of(&src, f).map(|m| (m, f.clone())))
        .collect();
    let known: BTreeSet<String> = modules.iter().map(|(m, _)| m.clone()).collect();
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("read source");
        let is_mod_rs = file.file_name().is_some_and(|n| n == "mod.rs");
        let mut targets = imports(module, is_mod_rs, &code_only(&text), &known);
        // A module's own `mod.rs` declaring and re-exporting its children is structure, not an
        // import; children naming their parent's items still count.
        targets.retain(|t| !t.starts_with(&format!("{module}::")));
        edges.insert(module.clone(), targets);
    }
    Graph { edges }
}

#[test]
fn imports_only_go_down_the_flow() {
    let graph = read_graph();
    let rank: BTreeMap<&str, u8> = RANKS.iter().copied().collect();
    let mut upward = Vec::new();
    for (from, targets) in &graph.edges {
        let Some(&from_rank) = rank.get(top(from)) else {
            panic!(
                "module `{}` has no rank in RANKS: place it in the flow",
                top(from)
            );
        };
        for to in targets {
            if top(to) == top(from) {
                continue;
            }
            let to_rank = rank[top(to)];
            if to_rank >= from_rank {
                upward.push(format!("{from} -> {to} ({from_rank} -> {to_rank})"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the flow (a module may import only lower ranks):\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_import_cycles() {
    let graph = read_graph();
    // Depth-first search for a back edge; reports the cycle it closes.
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                0 => visit(next, graph, state, stack, cycles),
                1 => {
                    let at = stack.iter().position(|m| m == next).unwrap_or(0);
                    cycles.push(format!("{} -> {next}", stack[at..].join(" -> ")));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    let mut cycles = Vec::new();
    for node in graph.edges.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            visit(node, &graph, &mut state, &mut Vec::new(), &mut cycles);
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_reader_sees_imports() {
    // The checks above are only as good as the reader: it must find these known arrows.
    let graph = read_graph();
    let has = |from: &str, to: &str| graph.edges.get(from).is_some_and(|t| t.contains(to));
    assert!(has("routing", "layers"), "{:?}", graph.edges.get("routing"));
    assert!(has("upstream::pool", "upstream::backend"));
    assert!(has("upstream::pool", "vocab::normalise"));
    assert!(has("process", "server"));
    let code = code_only("use crate::proxy::X; // crate::admin\nlet s = \"crate::metrics\";");
    let known: BTreeSet<String> = ["proxy", "admin", "metrics"].map(String::from).into();
    let found = imports("layers", true, &code, &known);
    assert_eq!(found, ["proxy".to_string()].into());
}
