//! The config reader on arbitrary text: upstreams.yaml in either shape (Aralez's `upstreams:`
//! and the older top-level hosts) and main.yaml. Whatever the text, reading ends in a config or
//! in issues that name a line, never in a panic; an issue's text always renders.
#![no_main]

use std::path::Path;

use aralez::config::{parse_main_text, parse_upstreams_text, Issues};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let mut issues = Issues::default();
    let read = if which % 2 == 0 {
        parse_upstreams_text(text, "/fuzz/upstreams.yaml", &mut issues).is_some()
    } else {
        parse_main_text(text, Path::new("/fuzz/main.yaml"), &mut issues).is_some()
    };
    for issue in &issues.list {
        assert!(issue.line >= 1, "an issue without a line: {issue}");
        let _ = issue.to_string();
    }
    assert!(read || issues.has_errors(), "refused without saying why");
});
