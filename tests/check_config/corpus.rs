//! The corpus of broken (and a few valid) config files: each case's files and the issues its
//! report must hold. The cases themselves are in `main_cases` and `upstreams_cases`.

mod main_cases;
mod upstreams_cases;

use std::path::PathBuf;

/// A main.yaml that is fine, pointing at `upstreams.yaml` beside it. Port 0: a proxy that wrongly
/// starts on a broken upstreams file must not collide with anything.
pub(crate) const MAIN_OK: &str =
    "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n";

/// An upstreams.yaml that is fine (v0.92 shape).
pub(crate) const UPS_OK: &str = "\
upstreams:
  example.com:
    paths:
      \"/\":
        servers: [\"127.0.0.1:8000\"]
";

/// Start of a v0.92 file whose path `/` of `a.com` is open at line 4; append its keys at 8 spaces.
pub(crate) const PATH_HEAD: &str = "\
upstreams:
  a.com:
    paths:
      \"/\":
";

pub(crate) const KEY_ROOT: &str = "upstreams.a.com.paths./";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sev {
    Error,
    Warning,
}

impl Sev {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Sev::Error => "error",
            Sev::Warning => "warning",
        }
    }
}

/// One issue the report must contain.
#[derive(Clone, Debug)]
pub(crate) struct Expect {
    pub(crate) file: &'static str,
    pub(crate) line: u64,
    pub(crate) key: String,
    pub(crate) msgs: Vec<&'static str>,
    pub(crate) sev: Sev,
}

impl Expect {
    /// Another substring the message must contain.
    pub(crate) fn also(mut self, msg: &'static str) -> Self {
        self.msgs.push(msg);
        self
    }
}

pub(crate) fn err(
    file: &'static str,
    line: u64,
    key: impl Into<String>,
    msg: &'static str,
) -> Expect {
    Expect {
        file,
        line,
        key: key.into(),
        msgs: vec![msg],
        sev: Sev::Error,
    }
}

pub(crate) fn warn(
    file: &'static str,
    line: u64,
    key: impl Into<String>,
    msg: &'static str,
) -> Expect {
    Expect {
        sev: Sev::Warning,
        ..err(file, line, key, msg)
    }
}

/// `upstreams.a.com.paths./.<rest>`
pub(crate) fn pk(rest: &str) -> String {
    format!("{KEY_ROOT}.{rest}")
}

pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) main: Vec<u8>,
    /// `None`: no upstreams.yaml is written.
    pub(crate) upstreams: Option<Vec<u8>>,
    pub(crate) conf_d: Vec<(&'static str, Vec<u8>)>,
    /// Empty folders made beside main.yaml.
    pub(crate) folders: Vec<&'static str>,
    pub(crate) exit: i32,
    pub(crate) issues: Vec<Expect>,
}

impl Case {
    pub(crate) fn broken(
        name: &'static str,
        main: &str,
        upstreams: &str,
        issues: Vec<Expect>,
    ) -> Case {
        Case {
            name,
            main: main.as_bytes().to_vec(),
            upstreams: Some(upstreams.as_bytes().to_vec()),
            conf_d: Vec::new(),
            folders: Vec::new(),
            exit: 1,
            issues,
        }
    }

    /// A v0.92 file where `/` of `a.com` has these keys (each line indented by 8 spaces).
    pub(crate) fn path(name: &'static str, body: &str, issues: Vec<Expect>) -> Case {
        Case::broken(name, MAIN_OK, &format!("{PATH_HEAD}{body}"), issues)
    }

    /// A broken main.yaml beside a valid upstreams.yaml.
    pub(crate) fn main(name: &'static str, main: &str, issues: Vec<Expect>) -> Case {
        Case::broken(name, main, UPS_OK, issues)
    }

    pub(crate) fn warnings_only(mut self) -> Case {
        self.exit = 0;
        self
    }

    pub(crate) fn with_conf_d(mut self, file: &'static str, text: &str) -> Case {
        self.conf_d.push((file, text.as_bytes().to_vec()));
        self
    }

    pub(crate) fn with_folder(mut self, folder: &'static str) -> Case {
        self.folders.push(folder);
        self
    }

    pub(crate) fn with_upstreams_bytes(mut self, bytes: Vec<u8>) -> Case {
        self.upstreams = Some(bytes);
        self
    }

    pub(crate) fn without_upstreams(mut self) -> Case {
        self.upstreams = None;
        self
    }

    /// Writes the files into a fresh directory; returns it and the main.yaml path.
    pub(crate) fn write(&self) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let main = dir.path().join("main.yaml");
        std::fs::write(&main, &self.main).unwrap();
        if let Some(ups) = &self.upstreams {
            std::fs::write(dir.path().join("upstreams.yaml"), ups).unwrap();
        }
        for folder in &self.folders {
            std::fs::create_dir_all(dir.path().join(folder)).unwrap();
        }
        if !self.conf_d.is_empty() {
            let conf_d = dir.path().join("conf.d");
            std::fs::create_dir(&conf_d).unwrap();
            for (name, text) in &self.conf_d {
                std::fs::write(conf_d.join(name), text).unwrap();
            }
        }
        (dir, main)
    }
}

pub(crate) fn alias_bomb() -> String {
    let lol = ["\"lol\""; 9].join(",");
    let mut doc = format!("a: &a [{lol}]\n");
    let mut prev = 'a';
    for name in 'b'..='j' {
        let refs = vec![format!("*{prev}"); 9].join(",");
        doc.push_str(&format!("{name}: &{name} [{refs}]\n"));
        prev = name;
    }
    doc
}

pub(crate) fn fifty_megabytes() -> Vec<u8> {
    let line = b"# padding padding padding padding padding padding padding padding padding\n";
    let mut out = Vec::with_capacity(50 * 1024 * 1024 + line.len());
    out.extend_from_slice(UPS_OK.as_bytes());
    while out.len() < 50 * 1024 * 1024 {
        out.extend_from_slice(line);
    }
    out
}

impl Case {
    pub(crate) fn with_main_bytes(mut self, bytes: Vec<u8>) -> Case {
        self.main = bytes;
        self
    }
}

/// Every case of the corpus.
pub(crate) fn cases() -> Vec<Case> {
    let mut all = main_cases::cases();
    all.extend(upstreams_cases::cases());
    all
}
