//! Validation of operator- and broker-supplied strings (endpoints, topic names,
//! topic configs) before they enter the replicated state. Pure; no I/O.

use std::collections::BTreeMap;

use crate::command::CommandError;
use crate::limits::StateLimits;
use crate::records::{BrokerEndpoints, UNCLEAN_LEADER_ELECTION_ENABLE};

/// Kafka's limit, so names stay valid as file names with a partition suffix.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;

pub fn endpoints(endpoints: &BrokerEndpoints, limits: &StateLimits) -> Result<(), CommandError> {
    host_port(&endpoints.client, limits)?;
    if endpoints.shards.is_empty() {
        return Err(CommandError::InvalidEndpoints(
            "a broker needs at least one shard".into(),
        ));
    }
    if endpoints.shards.len() > limits.shard_count_max {
        return Err(CommandError::InvalidEndpoints(format!(
            "{} shards, at most {}",
            endpoints.shards.len(),
            limits.shard_count_max
        )));
    }
    endpoints
        .shards
        .iter()
        .try_for_each(|e| host_port(e, limits))
}

fn host_port(endpoint: &str, limits: &StateLimits) -> Result<(), CommandError> {
    let bad = |why: &str| CommandError::InvalidEndpoints(format!("{endpoint:?}: {why}"));
    if endpoint.len() > limits.endpoint_bytes_max {
        return Err(bad("too long"));
    }
    let (host, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port"))?;
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("bad host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad("bad port")),
    }
}

pub fn topic_name(name: &str) -> Result<(), CommandError> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.is_empty()
        || name.len() > TOPIC_NAME_BYTES_MAX
        || !valid_chars
        || name == "."
        || name == ".."
    {
        return Err(CommandError::InvalidTopicName(name.to_owned()));
    }
    Ok(())
}

pub fn topic_config(
    config: &BTreeMap<String, String>,
    limits: &StateLimits,
) -> Result<(), CommandError> {
    if config.len() > limits.config_entries_max {
        return Err(CommandError::InvalidConfig {
            key: String::new(),
            reason: format!(
                "{} entries, at most {}",
                config.len(),
                limits.config_entries_max
            ),
        });
    }
    for (key, value) in config {
        let bad = |reason: &str| CommandError::InvalidConfig {
            key: key.clone(),
            reason: reason.into(),
        };
        if key.is_empty()
            || key.len() > limits.config_bytes_max
            || value.len() > limits.config_bytes_max
        {
            return Err(bad("key or value length out of bounds"));
        }
        if key == UNCLEAN_LEADER_ELECTION_ENABLE && value != "true" && value != "false" {
            return Err(bad("expected true or false"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Endpoints must be host:port with a non-zero port, and a broker needs a shard.
    #[test]
    fn endpoints_are_checked() {
        let limits = StateLimits::default();
        let ok = BrokerEndpoints {
            client: "h:1".into(),
            shards: vec!["h:2".into()],
        };
        assert!(endpoints(&ok, &limits).is_ok());
        let ipv6 = BrokerEndpoints {
            client: "[::1]:9092".into(),
            shards: vec!["[::1]:9093".into()],
        };
        assert!(endpoints(&ipv6, &limits).is_ok());
        for bad in ["h", ":1", "h:0", "h:x", "h:70000", "a b:1"] {
            let e = BrokerEndpoints {
                client: bad.into(),
                shards: vec!["h:2".into()],
            };
            assert!(endpoints(&e, &limits).is_err(), "{bad}");
        }
        let no_shards = BrokerEndpoints {
            client: "h:1".into(),
            shards: vec![],
        };
        assert!(endpoints(&no_shards, &limits).is_err());
    }

    // Topic names follow Kafka's rules.
    #[test]
    fn topic_names_are_checked() {
        assert!(topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(250)] {
            assert!(topic_name(bad).is_err(), "{bad}");
        }
    }
}
