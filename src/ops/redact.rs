//! Keeping secrets out of logs.
//!
//! The first line of defence is the type: [`Secret`](crate::secret::Secret) prints `***`. It cannot cover
//! text the process did not build itself (a library's debug output of a connection URL, an error that
//! quotes a rendered pod argument with a license key) or prost's derived `Debug` of a `SubmitJob`, which
//! prints the VNC password. So every log line also passes through a [`Redactor`] before it is written
//! (see [`telemetry`](super::telemetry)), which removes:
//!
//! - **known secrets**, in every form they can take in a log line: as written, percent-decoded (URL
//!   passwords), and escaped once or twice for `Debug` and JSON (a JSON log line of a `Debug` value
//!   escapes twice). The configuration's secrets (the AMQP password, license keys) are known for the
//!   life of the process ([`Redactor::add`] with `Config::secrets`); a message's secrets (its VNC password) while the
//!   message is handled ([`Redactor::hold`]).
//! - **secret-shaped text**, whatever its value: the password of any `scheme://user:password@host` URL,
//!   and the value after a `password` or `vnc_password` / `vncPassword` key in `Debug`, JSON and
//!   `key=value` form.
//!
//! Known secrets shorter than [`MIN_SECRET_LEN`] bytes are not replaced wherever they occur (every `a` in
//! a log would go); the shape rules still catch them in URLs and password fields.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock, RwLock};

use regex::Regex;

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// Known secrets shorter than this are only removed by the shape rules.
pub const MIN_SECRET_LEN: usize = 4;

#[derive(Default)]
struct State {
    /// Every form of every secret known for the life of the process.
    fixed: BTreeSet<String>,
    /// Secrets held while a message is handled, by hold id.
    held: BTreeMap<u64, Vec<String>>,
    next_hold: u64,
}

/// The process's list of secrets, and the scrubber that removes them from text. Cheap to clone; all clones
/// share the list.
#[derive(Clone, Default)]
pub struct Redactor {
    state: Arc<RwLock<State>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.read();
        f.debug_struct("Redactor")
            .field("known", &state.fixed.len())
            .field("held", &state.held.len())
            .finish()
    }
}

/// A message's secret, removed from logs until this is dropped.
#[must_use = "the secret is only redacted while this guard lives"]
pub struct HeldSecret {
    redactor: Redactor,
    id: u64,
}

impl Drop for HeldSecret {
    fn drop(&mut self) {
        self.redactor.write().held.remove(&self.id);
    }
}

impl Redactor {
    /// An empty list (tests; the process uses [`Redactor::global`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// The redactor the process's log output goes through.
    pub fn global() -> &'static Redactor {
        static GLOBAL: OnceLock<Redactor> = OnceLock::new();
        GLOBAL.get_or_init(Redactor::new)
    }

    /// Remembers a secret for the life of the process.
    pub fn add(&self, secret: &str) {
        let forms = forms(secret);
        self.write().fixed.extend(forms);
    }

    /// Removes `secret` from logs until the guard is dropped: for a secret that arrives with a message
    /// (a VNC password), held while the message is handled.
    pub fn hold(&self, secret: &str) -> HeldSecret {
        let forms: Vec<String> = forms(secret).into_iter().collect();
        let mut state = self.write();
        let id = state.next_hold;
        state.next_hold += 1;
        state.held.insert(id, forms);
        HeldSecret {
            redactor: self.clone(),
            id,
        }
    }

    /// `text` without any secret it contains. Borrowed when there was nothing to remove.
    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        {
            let state = self.read();
            // Longest first, so a secret that contains another is replaced whole.
            let mut known: Vec<&String> = state
                .fixed
                .iter()
                .chain(state.held.values().flatten())
                .filter(|s| text.contains(s.as_str()))
                .collect();
            known.sort_by_key(|s| std::cmp::Reverse(s.len()));
            for secret in known {
                if text.contains(secret.as_str()) {
                    text = Cow::Owned(text.replace(secret.as_str(), MASK));
                }
            }
        }
        if let Cow::Owned(s) = scrub_url_passwords(&text) {
            text = Cow::Owned(s);
        }
        if let Cow::Owned(s) = scrub_password_fields(&text) {
            text = Cow::Owned(s);
        }
        text
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The password in a URL's user info (`amqp://user:password@host/vhost`), as written (percent-encoded).
pub fn url_password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then_some(password)
}

/// Every way `secret` can appear in a log line: as is and percent-decoded, each escaped zero, one or two
/// times for `Debug` and JSON strings. Forms shorter than [`MIN_SECRET_LEN`] are left out.
fn forms(secret: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seeds = vec![secret.to_owned()];
    let decoded = percent_decode(secret);
    if decoded != secret {
        seeds.push(decoded);
    }
    for seed in seeds {
        let once = [debug_escape(&seed), json_escape(&seed)];
        for first in once {
            out.insert(debug_escape(&first));
            out.insert(json_escape(&first));
            out.insert(first);
        }
        out.insert(seed);
    }
    out.retain(|s| s.len() >= MIN_SECRET_LEN);
    out
}

fn debug_escape(s: &str) -> String {
    let quoted = format!("{s:?}");
    quoted[1..quoted.len() - 1].to_owned()
}

fn json_escape(s: &str) -> String {
    let quoted = serde_json::Value::String(s.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `scheme://user:password@` becomes `scheme://user:***@`, for any scheme.
fn scrub_url_passwords(text: &str) -> Cow<'_, str> {
    static URL: OnceLock<Regex> = OnceLock::new();
    let re = URL.get_or_init(|| {
        Regex::new(r#"([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@"'\\]*:)[^\s@/"'\\]+@"#)
            .expect("the URL pattern compiles")
    });
    re.replace_all(text, format!("${{1}}{MASK}@"))
}

/// The value after a password key, in the forms logs show it: `password: "x"`, `password: Some("x")`,
/// `"password":"x"`, `\"vncPassword\":\"x\"` (JSON inside a JSON log line), `password=x`.
fn scrub_password_fields(text: &str) -> Cow<'_, str> {
    static KEY: OnceLock<Regex> = OnceLock::new();
    let re = KEY.get_or_init(|| {
        Regex::new(r#"(?i)(?:vnc_?)?pass(?:word|wd)\\*"?\s*([:=])\s*(?:Some\(\s*)?"#)
            .expect("the key pattern compiles")
    });
    let mut out = String::new();
    let mut copied = 0;
    for m in re.captures_iter(text) {
        let whole = m.get(0).expect("match");
        if whole.start() < copied {
            continue;
        }
        let separator = &m[1];
        let start = whole.end();
        let Some(end) = value_end(text, start, separator == "=") else {
            continue;
        };
        if end.value_start == end.value_end {
            continue;
        }
        out.push_str(&text[copied..end.value_start]);
        out.push_str(MASK);
        copied = end.value_end;
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

struct ValueSpan {
    value_start: usize,
    value_end: usize,
}

/// Where the value after a key starts and ends. A quoted value opened by `k` backslashes and a quote ends
/// at the quote whose run of preceding backslashes `r` satisfies `r mod 2(k+1) == k` (one escaping
/// layer per level of nesting: a quote inside the value has a longer run of the wrong remainder). An
/// unquoted value (only after `=`) ends at whitespace, `,` or a closing bracket.
fn value_end(text: &str, start: usize, unquoted_ok: bool) -> Option<ValueSpan> {
    let bytes = text.as_bytes();
    let mut i = start;
    while i < bytes.len() && bytes[i] == b'\\' {
        i += 1;
    }
    let k = i - start;
    if i < bytes.len() && bytes[i] == b'"' {
        let value_start = i + 1;
        let mut j = value_start;
        let mut run = 0usize;
        while j < bytes.len() {
            match bytes[j] {
                b'\\' => run += 1,
                b'"' => {
                    if run % (2 * (k + 1)) == k {
                        return Some(ValueSpan {
                            value_start,
                            value_end: j - k,
                        });
                    }
                    run = 0;
                }
                _ => run = 0,
            }
            j += 1;
        }
        // No closing quote on this line: hide the rest.
        return Some(ValueSpan {
            value_start,
            value_end: bytes.len(),
        });
    }
    if !unquoted_ok || k > 0 {
        return None;
    }
    let value_end = text[start..]
        .find(|c: char| c.is_whitespace() || matches!(c, ',' | '}' | ')' | ']'))
        .map_or(text.len(), |n| start + n);
    Some(ValueSpan {
        value_start: start,
        value_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, LicenseServer, Secret};

    #[test]
    fn known_secrets_go_in_every_form() {
        let r = Redactor::new();
        r.add("s3cr\"et/p@ss");
        let secret = "s3cr\"et/p@ss";
        let debug = format!("{:?}", secret);
        let json = serde_json::json!({ "field": secret }).to_string();
        let json_of_debug = serde_json::json!({ "message": format!("value={debug}") }).to_string();
        let encoded = "s3cr%22et%2Fp%40ss";
        for line in [
            format!("plain {secret} end"),
            format!("debug {debug} end"),
            json.clone(),
            json_of_debug.clone(),
        ] {
            let scrubbed = r.scrub(&line);
            assert!(!scrubbed.contains("s3cr"), "{line} -> {scrubbed}");
            assert!(scrubbed.contains(MASK), "{scrubbed}");
        }
        // Percent-encoded forms are known when the secret was given encoded (a URL password).
        let r = Redactor::new();
        r.add(encoded);
        assert_eq!(r.scrub(&format!("x {encoded} y")), "x *** y");
        assert_eq!(r.scrub(&format!("x {secret} y")), "x *** y");
    }

    #[test]
    fn text_without_secrets_is_untouched_and_borrowed() {
        let r = Redactor::new();
        r.add("hunter22");
        let line = "job 42 started on node-3 (password field absent)";
        assert!(matches!(r.scrub(line), Cow::Borrowed(_)));
    }

    #[test]
    fn the_configuration_secrets_are_known() {
        let mut config = Config::default();
        config.broker.url = Secret::new("amqp://runner:Zq9%40long@rabbit:5672/prod");
        config.licenses.insert(
            "matlab".into(),
            LicenseServer {
                address: "lic.example.org".into(),
                port: 27000,
                license: Some(Secret::new("LIC-KEY-0042")),
            },
        );
        let r = Redactor::new();
        for secret in config.secrets() {
            r.add(secret);
        }
        let line = "args [\"lic.example.org:27000/LIC-KEY-0042\"] password Zq9@long Zq9%40long";
        let scrubbed = r.scrub(line);
        assert_eq!(
            scrubbed,
            "args [\"lic.example.org:27000/***\"] password *** ***"
        );
    }

    #[test]
    fn held_secrets_last_as_long_as_the_guard() {
        let r = Redactor::new();
        let guard = r.hold("vnc-pw-123");
        assert_eq!(r.scrub("x vnc-pw-123"), "x ***");
        drop(guard);
        assert_eq!(r.scrub("x vnc-pw-123"), "x vnc-pw-123");
    }

    #[test]
    fn url_passwords_go_whatever_their_value() {
        let r = Redactor::new();
        assert_eq!(
            r.scrub("connecting to amqp://guest:guest@127.0.0.1:5672/%2f failed"),
            "connecting to amqp://guest:***@127.0.0.1:5672/%2f failed"
        );
        assert_eq!(
            r.scrub("\"url\":\"amqps://u:p%2Fw@h/v\""),
            "\"url\":\"amqps://u:***@h/v\""
        );
        // Ports and paths are not passwords.
        let line = "GET http://127.0.0.1:8080/api/v1/pods@x";
        assert_eq!(r.scrub(line), line);
    }

    #[test]
    fn password_fields_go_whatever_their_value() {
        let r = Redactor::new();
        let cases = [
            (
                r#"Application { vnc_password: Some("pw\"q"), web_port: None }"#,
                r#"Application { vnc_password: Some("***"), web_port: None }"#,
            ),
            (
                r#"{"vncPassword":"a\"b\\","vncPort":5900}"#,
                r#"{"vncPassword":"***","vncPort":5900}"#,
            ),
            (
                // JSON log line whose message holds a Debug value with a quote inside.
                r#"{"message":"AMQPUserInfo { username: \"guest\", password: \"gu\\\"est\" }"}"#,
                r#"{"message":"AMQPUserInfo { username: \"guest\", password: \"***\" }"}"#,
            ),
            (
                "connect user=guest password=hunter2, retrying",
                "connect user=guest password=***, retrying",
            ),
            (
                r#"{"application":{"vncPassword":""}}"#,
                r#"{"application":{"vncPassword":""}}"#,
            ),
            ("vnc_password: None", "vnc_password: None"),
            ("password: ***", "password: ***"),
        ];
        for (line, expected) in cases {
            assert_eq!(r.scrub(line), expected, "{line}");
        }
    }

    #[test]
    fn a_real_submit_job_debug_loses_its_vnc_password() {
        use crate::messages::v1::{Application, SubmitJob};
        let job = SubmitJob {
            job_id: "42".into(),
            application: Some(Application {
                name: "vnc".into(),
                vnc_password: Some("tiger\"1\\x".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = Redactor::new();
        let debug = format!("{job:?}");
        assert!(debug.contains("tiger"), "prost's Debug changed: {debug}");
        assert!(!r.scrub(&debug).contains("tiger"), "{}", r.scrub(&debug));
        let pretty = format!("{job:#?}");
        assert!(!r.scrub(&pretty).contains("tiger"));
        let json = serde_json::to_string(&job).unwrap();
        assert!(!r.scrub(&json).contains("tiger"), "{json}");
        let nested = serde_json::json!({ "message": debug }).to_string();
        assert!(!r.scrub(&nested).contains("tiger"), "{nested}");
    }

    #[test]
    fn url_password_extraction() {
        assert_eq!(url_password("amqp://u:p@h/v"), Some("p"));
        assert_eq!(url_password("amqp://u:p:q@h"), Some("p:q"));
        assert_eq!(url_password("amqp://u@h"), None);
        assert_eq!(url_password("amqp://h/v@x"), None);
        assert_eq!(url_password("amqp://u:@h"), None);
        assert_eq!(url_password("not a url"), None);
    }
}
