//! `[proxy_sync]`: the settings of the proxy-sync role (`volcano-runner proxy-sync`, [`crate::proxy`]).
//! Where routes are published (`<prefix><jobId>-<rank>.<domain>`) is `[pipeline.proxy]`, shared with the
//! runners.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The `[proxy_sync]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySyncConfig {
    /// Where the Envoy configuration is written (`bootstrap.json`, `lds.json`, `rds.json`, `cds.json`);
    /// empty: no files, the route table only.
    pub envoy_dir: PathBuf,
    /// The port of Envoy's HTTP listener.
    pub listen_port: u16,
    /// How long Envoy waits for a pod to accept a connection.
    #[serde(with = "duration::required")]
    pub connect_timeout: Duration,
    /// Changes within this interval are written to the Envoy files together.
    #[serde(with = "duration::required")]
    pub coalesce: Duration,
    /// How many proxy events may be in flight to this instance at once.
    pub prefetch: u16,
    /// How long a removed job is remembered, so that an event about it that arrives late cannot bring
    /// its routes back.
    #[serde(with = "duration::required")]
    pub removed_retention: Duration,
    /// Caddy's admin API (`http://127.0.0.1:2019`): the routes are pushed to the Caddy behind it as
    /// well ([`crate::proxy::caddy`]); empty: no Caddy.
    pub caddy_admin: String,
    /// How often Caddy's live configuration is checked for being the one pushed (a restarted Caddy, or
    /// one whose configuration was replaced, gets the whole configuration again).
    #[serde(with = "duration::required")]
    pub caddy_check: Duration,
    /// The session check every request goes through first (`http://127.0.0.1:9901/authz`: Envoy's
    /// ext_authz, Caddy's forward_auth); empty: requests are not checked.
    pub authz_url: String,
    /// Where paths under `/.volcano-runner/` go (the VNC, terminal and logs bridges,
    /// `http://127.0.0.1:9902`); empty: they go to the pod like any path.
    pub bridge_url: String,
    /// Where the session bridges (VNC, terminal, logs: docs/proxy.md) listen, `host:port`; the proxy
    /// sends `/.volcano-runner/` paths there after the session check. Empty: no bridges.
    pub bridge_listen: String,
    /// Where the session check (`/authz`, for the proxy's forward_auth / ext_authz) listens; empty: not
    /// served.
    pub authz_listen: String,
    /// The largest request head the session check reads (at least 8 KiB); a larger one is answered 431.
    pub authz_max_header_bytes: usize,
}

mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

impl Default for ProxySyncConfig {
    fn default() -> Self {
        Self {
            envoy_dir: PathBuf::new(),
            listen_port: 8080,
            connect_timeout: Duration::from_secs(5),
            coalesce: Duration::from_millis(100),
            prefetch: 256,
            removed_retention: Duration::from_secs(3600),
            caddy_admin: String::new(),
            caddy_check: Duration::from_secs(2),
            authz_url: String::new(),
            bridge_url: String::new(),
            bridge_listen: "127.0.0.1:8082".to_owned(),
            authz_listen: String::new(),
            authz_max_header_bytes: 16 * 1024,
        }
    }
}

/// A `[proxy_sync]` setting that cannot work: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct ProxySyncConfigError {
    pub key: String,
    pub reason: String,
}

impl ProxySyncConfig {
    /// Checks what serde cannot.
    pub fn check(&self) -> Result<(), ProxySyncConfigError> {
        let invalid = |key: &str, reason: &str| ProxySyncConfigError {
            key: format!("proxy_sync.{key}"),
            reason: reason.to_owned(),
        };
        if self.listen_port == 0 {
            return Err(invalid("listen_port", "must be 1 to 65535"));
        }
        if self.prefetch == 0 {
            return Err(invalid(
                "prefetch",
                "must be at least 1 (0 would mean unlimited)",
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be longer than zero"));
        }
        if self.removed_retention.is_zero() {
            return Err(invalid(
                "removed_retention",
                "must be longer than zero, or a late CREATE could bring a removed job back",
            ));
        }
        if self.caddy_check.is_zero() {
            return Err(invalid("caddy_check", "must be longer than zero"));
        }
        for (key, url) in [
            ("caddy_admin", &self.caddy_admin),
            ("authz_url", &self.authz_url),
            ("bridge_url", &self.bridge_url),
        ] {
            if !url.is_empty() {
                Upstream::parse(url).map_err(|reason| invalid(key, &reason))?;
            }
        }
        if !self.bridge_listen.is_empty()
            && self.bridge_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(invalid(
                "bridge_listen",
                "must be an IP address and port such as 127.0.0.1:8082 (or empty: no bridges)",
            ));
        }
        if !self.authz_listen.is_empty()
            && self.authz_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(invalid(
                "authz_listen",
                "must be an address and port such as 127.0.0.1:9190, or empty",
            ));
        }
        if !(8192..=1024 * 1024).contains(&self.authz_max_header_bytes) {
            return Err(invalid("authz_max_header_bytes", "must be 8192 to 1048576"));
        }
        Ok(())
    }
}

/// An HTTP address of `[proxy_sync]` (`caddy_admin`, `authz_url`, `bridge_url`), taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The host: an IP address or a name.
    pub host: String,
    pub port: u16,
    /// The path, `/` when none was given.
    pub path: String,
}

impl Upstream {
    /// Parses `http://host:port/path` (the port defaults to 80); the reason when it is not one.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL ({e}); write http://host:port/path"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "{url:?} must start with http:// (the proxy talks plain HTTP to its own sidecars)"
            ));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{url:?} has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if uri.query().is_some() {
            return Err(format!("{url:?} must not have a query"));
        }
        Ok(Self {
            host,
            port: uri.port_u16().unwrap_or(80),
            path: uri.path().to_owned(),
        })
    }

    /// `host:port`, with brackets around an IPv6 address (a dial address).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_the_key() {
        let c = ProxySyncConfig {
            prefetch: 0,
            ..ProxySyncConfig::default()
        };
        assert_eq!(c.check().unwrap_err().key, "proxy_sync.prefetch");
        let c: ProxySyncConfig = toml::from_str("coalesce = \"250ms\"").unwrap();
        assert_eq!(c.coalesce, Duration::from_millis(250));
        let e = toml::from_str::<ProxySyncConfig>("colaesce = \"250ms\"").unwrap_err();
        assert!(e.to_string().contains("colaesce"), "{e}");
        ProxySyncConfig::default().check().unwrap();
        let c = ProxySyncConfig {
            authz_url: "127.0.0.1:9901/authz".into(),
            ..ProxySyncConfig::default()
        };
        assert_eq!(c.check().unwrap_err().key, "proxy_sync.authz_url");
    }

    #[test]
    fn upstreams_are_taken_apart() {
        let u = Upstream::parse("http://127.0.0.1:9901/authz").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 9901, "/authz")
        );
        assert_eq!(u.authority(), "127.0.0.1:9901");
        let u = Upstream::parse("http://[::1]:2019").unwrap();
        assert_eq!(
            (u.authority().as_str(), u.path.as_str()),
            ("[::1]:2019", "/")
        );
        assert!(
            Upstream::parse("https://x:1")
                .unwrap_err()
                .contains("http://")
        );
    }

    #[test]
    fn a_bridge_address_must_be_an_ip_and_port() {
        let c = ProxySyncConfig {
            bridge_listen: "localhost".into(),
            ..ProxySyncConfig::default()
        };
        assert_eq!(c.check().unwrap_err().key, "proxy_sync.bridge_listen");
    }
}
