//! A YAML document as a tree whose every key and value knows its line and column.
//!
//! serde's derive stops at the first problem; an operator linting a config wants all of them, each
//! with its place. So the file is first read into this generic, spanned tree (serde-saphyr does the
//! parsing, with budgets against alias bombs and oversized input), and the typed readers in the
//! sibling modules walk it, collecting every issue. This module knows nothing about aralez keys.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// Largest config file read at all; anything bigger is refused before parsing.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Where a node stands in its file (1-based; 0 when unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    fn of<T>(spanned: &Spanned<T>) -> Self {
        Pos {
            line: u32::try_from(spanned.referenced.line()).unwrap_or(u32::MAX),
            column: u32::try_from(spanned.referenced.column()).unwrap_or(u32::MAX),
        }
    }
}

/// Where each key of a mapping was found, in the order of the file (main.yaml's top level, for
/// the checks that run once every key is read).
#[derive(Default)]
pub struct KeyPositions<'a>(Vec<(&'a str, Pos)>);

impl<'a> KeyPositions<'a> {
    pub fn note(&mut self, key: &'a str, pos: Pos) {
        self.0.push((key, pos));
    }

    pub fn of(&self, key: &str) -> Option<Pos> {
        self.first_of(&[key]).map(|(_, pos)| pos)
    }

    /// The first of `keys` (in their order) that the mapping has, and where.
    pub fn first_of<'k>(&self, keys: &[&'k str]) -> Option<(&'k str, Pos)> {
        keys.iter().find_map(|k| {
            self.0
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, p)| (*k, *p))
        })
    }

    pub fn in_order(&self) -> impl Iterator<Item = (&'a str, Pos)> + '_ {
        self.0.iter().copied()
    }
}

/// One YAML value with its position.
#[derive(Clone, Debug)]
pub struct Node {
    pub pos: Pos,
    pub value: Value,
    /// How a number or boolean was written, when it was written plainly (YAML reads `0123` as
    /// 123, `0x10` as 16, `yes` as true): what a key that takes text takes.
    pub written: Option<Box<str>>,
}

/// The shapes a YAML value can take.
#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// A mapping key (always read as text) with its position.
#[derive(Clone, Debug)]
pub struct Key {
    pub pos: Pos,
    pub name: String,
}

impl Value {
    /// A short description used in "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "nothing (null)",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// Why a document could not be read into a tree.
#[derive(Debug)]
pub struct ParseFailure {
    pub pos: Pos,
    /// The key written on the failing line before the failure, when there is one.
    pub key: Option<String>,
    pub message: String,
}

/// Most values (keys, scalars, list items, mappings) a file may hold: a million, far past any
/// configuration (90,000 hosts made 900,000), and what bounds the parser's memory with
/// [`MAX_FILE_BYTES`].
pub const MAX_VALUES: usize = 1_000_000;

/// Parses `text` into a spanned tree, within fixed budgets.
pub fn parse(text: &str) -> Result<Node, ParseFailure> {
    if text.trim().is_empty() {
        return Ok(Node {
            pos: Pos { line: 1, column: 1 },
            value: Value::Map(Vec::new()),
            written: None,
        });
    }
    let budget = serde_saphyr::budget! {
        max_aliases: 1_000,
        max_anchors: 1_000,
        max_nodes: MAX_VALUES,
        max_depth: 64,
        max_total_scalar_bytes: 16 * 1024 * 1024,
        max_documents: 1,
    };
    // Aliases are replayed event by event: cap the replay well below the node budget so an
    // alias bomb is refused after a few milliseconds of work, not after a million nodes.
    let alias_limits = serde_saphyr::alias_limits! {
        max_total_replayed_events: MAX_ALIAS_REPLAYED_EVENTS,
        max_replay_stack_depth: 16,
    };
    let options = serde_saphyr::options! {
        budget: budget,
        alias_limits: alias_limits,
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    };
    match serde_saphyr::from_str_with_options::<Spanned<RawNode>>(text, options) {
        Ok(root) => {
            let mut root = root.into_node();
            let lines: Vec<&str> = text.lines().collect();
            note_written(&mut root, &lines);
            Ok(root)
        }
        Err(err) => {
            let pos = err
                .location()
                .map(|loc| Pos {
                    line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
                    column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
                })
                // Some errors carry no location (a top-level integer too large for i64): the
                // document's start is the place to look, never line 0.
                .unwrap_or(Pos { line: 1, column: 1 });
            let mut message = describe(&err);
            if !message.contains("unclosed") {
                if let Some((open, line)) = unclosed_flow_before(text, pos) {
                    message.push_str(&format!(" (is the `{open}` on line {line} closed?)"));
                }
            }
            let key = key_on_line(text, pos);
            Err(ParseFailure { pos, key, message })
        }
    }
}

/// The block-mapping key written on `pos`'s line before its column (`  threads: .inf` gives
/// `threads`; a list item's `- name: x` gives `name`; `"a.test": [` gives `a.test`), so a parse
/// failure names a key as every other error does. None where that key may not be the one at
/// fault: a flow collection (`{`, `[`) opens before the column (the failure may lie inside it,
/// under another key), or the key is written with escapes, a tag or an anchor.
fn key_on_line(text: &str, pos: Pos) -> Option<String> {
    let index = usize::try_from(pos.line).ok()?.checked_sub(1)?;
    // A line that begins inside a quoted value an earlier line opened: its `key:` is text.
    let line_start = Pos {
        line: pos.line,
        column: 1,
    };
    if walk_unquoted(text, line_start, |_, _| {}) {
        return None;
    }
    let line = text.lines().nth(index)?;
    let before: String = line
        .chars()
        .take(pos.column.saturating_sub(1) as usize)
        .collect();
    let mut rest = before.trim_start();
    while let Some(item) = rest.strip_prefix("- ") {
        rest = item.trim_start();
    }
    let (key, after) = match rest.chars().next()? {
        quote @ ('"' | '\'') => {
            let inner = &rest[1..];
            let end = inner.find(quote)?;
            (
                &inner[..end],
                inner[end + 1..].trim_start().strip_prefix(':')?,
            )
        }
        _ => {
            let (key, after) = rest.split_once(": ")?;
            (key.trim_end(), after)
        }
    };
    let plain = |c: char| !matches!(c, '"' | '\'' | '\\' | '#' | '{' | '[' | '!' | '&' | '*');
    let usable = !key.is_empty() && key.chars().all(plain) && !after.contains(['{', '[']);
    usable.then(|| key.to_string())
}

/// Walks `text` up to `end` (not included) as far as hints need YAML read: quoted scalars
/// (which may span lines; `\` escapes in double quotes) and comments are passed over, and
/// `each` gets every other character with its line. Whether `end` lies inside a quoted scalar.
/// A quote opens only where a value may begin, not inside a word (`it's`).
fn walk_unquoted(text: &str, end: Pos, mut each: impl FnMut(char, u32)) -> bool {
    let mut quote: Option<char> = None;
    for (idx, line) in text.lines().enumerate() {
        let line_no = u32::try_from(idx + 1).unwrap_or(u32::MAX);
        if line_no > end.line {
            break;
        }
        let mut prev = ' ';
        let mut chars = line.chars().enumerate();
        while let Some((col, c)) = chars.next() {
            if line_no == end.line && col + 1 >= end.column as usize {
                break;
            }
            match quote {
                Some('"') if c == '\\' => {
                    chars.next();
                }
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '#' && prev.is_whitespace() => break,
                None if matches!(c, '"' | '\'') && !prev.is_alphanumeric() => quote = Some(c),
                None => each(c, line_no),
            }
            prev = c;
        }
    }
    quote.is_some()
}

/// Most events that alias (`*name`) expansion may produce in one document.
const MAX_ALIAS_REPLAYED_EVENTS: usize = 100_000;

/// The parser's error in operator terms (its budget and policy names mean nothing to them).
fn describe(err: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach;
    use serde_saphyr::Error as E;
    let mut inner = err.without_snippet();
    while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = inner {
        inner = error;
    }
    match inner {
        E::DuplicateMappingKey { key: Some(key), .. } => {
            format!("duplicate key `{key}` (each key may appear once per mapping)")
        }
        E::DuplicateMappingKey { key: None, .. } => {
            "duplicate key (each key may appear once per mapping)".to_string()
        }
        E::AliasReplayLimitExceeded { .. }
        | E::AliasExpansionLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. }
        | E::AliasReplayCounterOverflow { .. } => format!(
            "aliases expand to too many values (over {MAX_ALIAS_REPLAYED_EVENTS}); refusing a possible alias bomb"
        ),
        E::Budget { breach, .. } => match breach {
            BudgetBreach::Aliases { .. } | BudgetBreach::AliasAnchorRatio { .. } => {
                "too many aliases (`*name`); refusing a possible alias bomb".to_string()
            }
            BudgetBreach::Anchors { .. } => "too many anchors (`&name`)".to_string(),
            BudgetBreach::Depth { .. } => "nested too deeply (over 64 levels)".to_string(),
            BudgetBreach::Documents { .. } => {
                "more than one YAML document (`---`) in the file".to_string()
            }
            BudgetBreach::ScalarBytes { .. } => "too much text in the values".to_string(),
            _ => format!("document is too large (over {MAX_VALUES} values: keys, values and list items)"),
        },
        E::NonFiniteFloat { value, .. } => {
            format!("`{value}` is not a finite number; write a number in decimal digits")
        }
        _ => first_line(&err.to_string()),
    }
}

/// The innermost `[` or `{` still open at `pos` that was opened on an earlier line, if any.
///
/// A flow collection left open makes the parser fail lines later with an unrelated complaint; the
/// bracket's line is what the operator needs. Quotes and comments are skipped; block scalars are
/// not understood, which is why callers only add this as a hint.
fn unclosed_flow_before(text: &str, pos: Pos) -> Option<(char, u32)> {
    let mut open: Vec<(char, u32)> = Vec::new();
    walk_unquoted(text, pos, |c, line| match c {
        '[' | '{' => open.push((c, line)),
        ']' | '}' => {
            open.pop();
        }
        _ => {}
    });
    open.last().copied().filter(|(_, line)| *line < pos.line)
}

fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or(message).trim();
    // serde-saphyr may append " at line L column C"; we print the position ourselves.
    match line.find(" at line ") {
        Some(idx) => line[..idx].to_string(),
        None => line.to_string(),
    }
}

/// Deserialization target mirroring `Value`, with spans on children.
enum RawNode {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<RawNode>>),
    Map(Vec<(Spanned<String>, Spanned<RawNode>)>),
}

trait IntoNode {
    fn into_node(self) -> Node;
}

impl IntoNode for Spanned<RawNode> {
    fn into_node(self) -> Node {
        let pos = Pos::of(&self);
        let value = match self.value {
            RawNode::Null => Value::Null,
            RawNode::Bool(b) => Value::Bool(b),
            RawNode::Int(i) => Value::Int(i),
            RawNode::Float(f) => Value::Float(f),
            RawNode::Str(s) => Value::Str(s),
            RawNode::Seq(items) => Value::Seq(items.into_iter().map(IntoNode::into_node).collect()),
            RawNode::Map(entries) => Value::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| {
                        let key = Key {
                            pos: Pos::of(&k),
                            name: k.value,
                        };
                        (key, v.into_node())
                    })
                    .collect(),
            ),
        };
        Node {
            pos,
            value,
            written: None,
        }
    }
}

/// Notes how each number and boolean under `node` was written ([`Node::written`]), and gives a
/// mapping key that YAML read as one (`no:`, `0x1F:`) the text it was written as: keys are
/// always text here, and `no:` became the host `false`.
fn note_written(node: &mut Node, lines: &[&str]) {
    match &mut node.value {
        Value::Bool(_) | Value::Int(_) | Value::Float(_) => {
            node.written = written_at(lines, node.pos, false).map(Box::from);
        }
        Value::Seq(items) => items.iter_mut().for_each(|n| note_written(n, lines)),
        Value::Map(entries) => {
            for (key, value) in entries {
                let read_as_scalar = matches!(key.name.as_str(), "true" | "false")
                    || key.name.parse::<f64>().is_ok();
                if let Some(text) = written_at(lines, key.pos, true).filter(|_| read_as_scalar) {
                    key.name = text.to_string();
                }
                note_written(value, lines);
            }
        }
        Value::Null | Value::Str(_) => {}
    }
}

/// The plain scalar written at `pos`, up to a blank, a comment or a flow indicator (and a `:`
/// for a `key`); `None` for an alias, anchor, tag or quoted text, or where nothing is.
fn written_at<'t>(lines: &[&'t str], pos: Pos, key: bool) -> Option<&'t str> {
    let line = lines.get((pos.line as usize).checked_sub(1)?)?;
    let start = line
        .char_indices()
        .nth((pos.column as usize).checked_sub(1)?)
        .map(|(at, _)| at)?;
    let rest = &line[start..];
    let end = rest
        .find(|c: char| c.is_whitespace() || ",]}#".contains(c) || (key && c == ':'))
        .unwrap_or(rest.len());
    let token = &rest[..end];
    let plain = !token.is_empty() && !token.starts_with(['*', '&', '!', '"', '\'', '[', '{']);
    plain.then_some(token)
}

impl<'de> Deserialize<'de> for RawNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = RawNode;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<RawNode, E> {
        Ok(RawNode::Null)
    }
    fn visit_none<E>(self) -> Result<RawNode, E> {
        Ok(RawNode::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<RawNode, D::Error> {
        RawNode::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<RawNode, E> {
        Ok(RawNode::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<RawNode, E> {
        Ok(RawNode::Int(v))
    }
    // An integer past i64 is kept as the number it is, for the key's reader to refuse with its
    // name and range, as larger ones are: failing the parse here hid every other issue behind
    // an unkeyed "invalid YAML".
    fn visit_u64<E>(self, v: u64) -> Result<RawNode, E> {
        Ok(i64::try_from(v).map_or(RawNode::Float(v as f64), RawNode::Int))
    }
    fn visit_i128<E>(self, v: i128) -> Result<RawNode, E> {
        Ok(i64::try_from(v).map_or(RawNode::Float(v as f64), RawNode::Int))
    }
    fn visit_u128<E>(self, v: u128) -> Result<RawNode, E> {
        Ok(i64::try_from(v).map_or(RawNode::Float(v as f64), RawNode::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<RawNode, E> {
        Ok(RawNode::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<RawNode, E> {
        Ok(RawNode::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<RawNode, E> {
        Ok(RawNode::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawNode, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<RawNode>>()? {
            items.push(item);
        }
        Ok(RawNode::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawNode, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let value = map.next_value::<Spanned<RawNode>>()?;
            let key = Spanned::new(key.value.0, key.referenced, key.defined);
            entries.push((key, value));
        }
        Ok(RawNode::Map(entries))
    }
}

/// A mapping key read as text whatever its YAML type (`80: x` gives the key "80").
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a plain mapping key")
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests;
