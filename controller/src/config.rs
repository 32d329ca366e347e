//! `ControllerConfig`: the typed, validated node-local configuration of one
//! `ringlog-controller` process, merged from a TOML file and command-line flags
//! (flags win). Every field is documented with unit, default and bound, and
//! validated once at start with a precise error per bad field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default broker session timeout: a broker missing heartbeats this long is fenced.
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 3_000;
/// Bound on the voters of the initial quorum.
pub const VOTERS_MAX: usize = 9;
/// Default Raft heartbeat interval.
pub const RAFT_HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 100;
/// Default lower end of the randomized election timeout (upper end is twice it).
pub const ELECTION_TIMEOUT_MS_DEFAULT: u64 = 500;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parse config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{field} is required (flag --{flag} or `{field}` in the config file)")]
    Missing {
        field: &'static str,
        flag: &'static str,
    },
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Settings as given, each optional; from the file or from flags.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialConfig {
    pub node_id: Option<u64>,
    pub listen: Option<String>,
    /// "ID=HOST:PORT,ID=HOST:PORT,..."
    pub peers: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub session_timeout_ms: Option<u64>,
    pub raft_heartbeat_interval_ms: Option<u64>,
    pub election_timeout_ms: Option<u64>,
}

impl PartialConfig {
    pub fn from_file(path: &Path) -> Result<PartialConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }

    /// Fields set in `over` replace those in `self`.
    pub fn overlay(self, over: PartialConfig) -> PartialConfig {
        PartialConfig {
            node_id: over.node_id.or(self.node_id),
            listen: over.listen.or(self.listen),
            peers: over.peers.or(self.peers),
            data_dir: over.data_dir.or(self.data_dir),
            session_timeout_ms: over.session_timeout_ms.or(self.session_timeout_ms),
            raft_heartbeat_interval_ms: over
                .raft_heartbeat_interval_ms
                .or(self.raft_heartbeat_interval_ms),
            election_timeout_ms: over.election_timeout_ms.or(self.election_timeout_ms),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// This controller's Raft node id; required, must be one of `peers`.
    pub node_id: u64,
    /// "HOST:PORT" to listen on for brokers, admin clients and peers; required.
    pub listen: String,
    /// The initial voters, this node included: id → "HOST:PORT" that peers and
    /// brokers dial. Required; 1..=`VOTERS_MAX` entries. Used only to bootstrap
    /// an empty store; afterwards membership comes from the replicated log.
    pub peers: BTreeMap<u64, String>,
    /// Directory of the Raft log, vote and snapshot; required, created if missing.
    pub data_dir: PathBuf,
    /// Broker session timeout, ms; default 3000; within the state's limits
    /// (100..=600000 by default).
    pub session_timeout_ms: u64,
    /// Raft leader heartbeat interval, ms; default 100; 10..=election timeout / 3.
    pub raft_heartbeat_interval_ms: u64,
    /// Lower end of the randomized election timeout, ms (upper is 2x); default 500;
    /// 50..=60000. Failover takes about this long plus one election round.
    pub election_timeout_ms: u64,
}

impl ControllerConfig {
    pub fn validate(partial: PartialConfig) -> Result<ControllerConfig, ConfigError> {
        let node_id = partial.node_id.ok_or(ConfigError::Missing {
            field: "node_id",
            flag: "node-id",
        })?;
        let listen = partial.listen.ok_or(ConfigError::Missing {
            field: "listen",
            flag: "listen",
        })?;
        check_host_port("listen", &listen)?;
        let peers = parse_peers(&partial.peers.ok_or(ConfigError::Missing {
            field: "peers",
            flag: "peers",
        })?)?;
        if !peers.contains_key(&node_id) {
            return Err(invalid(
                "peers",
                format!("does not list this node {node_id}"),
            ));
        }
        let data_dir = partial.data_dir.ok_or(ConfigError::Missing {
            field: "data_dir",
            flag: "data-dir",
        })?;
        let session_timeout_ms = partial
            .session_timeout_ms
            .unwrap_or(SESSION_TIMEOUT_MS_DEFAULT);
        let limits = crate::state::StateLimits::default();
        if !(limits.session_timeout_ms_min..=limits.session_timeout_ms_max)
            .contains(&session_timeout_ms)
        {
            return Err(invalid(
                "session_timeout_ms",
                format!(
                    "{session_timeout_ms} outside {}..={}",
                    limits.session_timeout_ms_min, limits.session_timeout_ms_max
                ),
            ));
        }
        let election_timeout_ms = partial
            .election_timeout_ms
            .unwrap_or(ELECTION_TIMEOUT_MS_DEFAULT);
        if !(50..=60_000).contains(&election_timeout_ms) {
            return Err(invalid("election_timeout_ms", "outside 50..=60000"));
        }
        let raft_heartbeat_interval_ms = partial
            .raft_heartbeat_interval_ms
            .unwrap_or(RAFT_HEARTBEAT_INTERVAL_MS_DEFAULT);
        if !(10..=election_timeout_ms / 3).contains(&raft_heartbeat_interval_ms) {
            return Err(invalid(
                "raft_heartbeat_interval_ms",
                format!("outside 10..={}", election_timeout_ms / 3),
            ));
        }
        Ok(ControllerConfig {
            node_id,
            listen,
            peers,
            data_dir,
            session_timeout_ms,
            raft_heartbeat_interval_ms,
            election_timeout_ms,
        })
    }
}

fn check_host_port(field: &'static str, endpoint: &str) -> Result<(), ConfigError> {
    match endpoint.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(invalid(field, format!("{endpoint:?} is not HOST:PORT"))),
    }
}

/// Parses "ID=HOST:PORT,..." into a map, refusing duplicate ids.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut peers = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, endpoint) = item
            .split_once('=')
            .ok_or_else(|| invalid("peers", format!("{item:?} is not ID=HOST:PORT")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| invalid("peers", format!("{id:?} is not a node id")))?;
        check_host_port("peers", endpoint.trim())?;
        if peers.insert(id, endpoint.trim().to_owned()).is_some() {
            return Err(invalid("peers", format!("node {id} listed twice")));
        }
    }
    if peers.is_empty() || peers.len() > VOTERS_MAX {
        return Err(invalid(
            "peers",
            format!("{} voters, need 1..={VOTERS_MAX}", peers.len()),
        ));
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial() -> PartialConfig {
        PartialConfig {
            node_id: Some(2),
            listen: Some("127.0.0.1:9002".into()),
            peers: Some("1=127.0.0.1:9001, 2=127.0.0.1:9002,3=127.0.0.1:9003".into()),
            data_dir: Some("/tmp/x".into()),
            ..PartialConfig::default()
        }
    }

    #[test]
    fn defaults_and_overlay() {
        let file = partial();
        let flags = PartialConfig {
            session_timeout_ms: Some(2_000),
            ..PartialConfig::default()
        };
        let config = ControllerConfig::validate(file.overlay(flags)).unwrap();
        assert_eq!(config.peers.len(), 3);
        assert_eq!(config.session_timeout_ms, 2_000);
        assert_eq!(config.election_timeout_ms, ELECTION_TIMEOUT_MS_DEFAULT);
    }

    #[test]
    fn bad_fields_are_named() {
        let mut p = partial();
        p.peers = Some("1=127.0.0.1:9001".into());
        assert!(matches!(
            ControllerConfig::validate(p),
            Err(ConfigError::Invalid { field: "peers", .. })
        ));
        let mut p = partial();
        p.peers = Some("2=a:1,2=b:2".into());
        assert!(matches!(
            ControllerConfig::validate(p),
            Err(ConfigError::Invalid { field: "peers", .. })
        ));
        let mut p = partial();
        p.session_timeout_ms = Some(1);
        assert!(matches!(
            ControllerConfig::validate(p),
            Err(ConfigError::Invalid {
                field: "session_timeout_ms",
                ..
            })
        ));
        let mut p = partial();
        p.listen = None;
        assert!(matches!(
            ControllerConfig::validate(p),
            Err(ConfigError::Missing {
                field: "listen",
                ..
            })
        ));
    }

    #[test]
    fn toml_file_parses() {
        let text = "node_id = 1\nlisten = \"127.0.0.1:9001\"\npeers = \"1=127.0.0.1:9001\"\ndata_dir = \"/d\"\n";
        let p: PartialConfig = toml::from_str(text).unwrap();
        assert_eq!(ControllerConfig::validate(p).unwrap().node_id, 1);
    }
}
