//! The broker's read-mostly picture of cluster metadata: topics, their
//! partitions, configs, and which shard owns each partition. Every shard keeps
//! its own copy and changes it only when shard 0 (the metadata owner, until the
//! controller takes that role) broadcasts a change. Also the durable
//! single-node store of that metadata.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::log::{FlushPolicy, LogConfig};

/// Longest topic name: it becomes a directory name with a partition suffix.
pub const TOPIC_NAME_BYTES_MAX: usize = 200;
/// Partitions of one topic.
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 10_000;
/// Topic config entries in one request.
pub const TOPIC_CONFIGS_MAX: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub id: u64,
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// A topic creation as requested, before validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// A rejected admin request: a stable code and a human reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminError {
    pub code: ErrorCode,
    pub message: String,
}

impl AdminError {
    fn new(code: ErrorCode, message: impl Into<String>) -> AdminError {
        AdminError {
            code,
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    pub topics: BTreeMap<String, TopicMeta>,
    pub next_topic_id: u64,
}

impl ClusterView {
    pub fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// The shard owning `partition` of the topic with id `topic_id`: consecutive
    /// partitions go to consecutive shards, starting at a topic-dependent shard
    /// so that many small topics still spread.
    pub fn shard_for(topic_id: u64, partition: i32, shard_count: usize) -> usize {
        ((topic_id + partition as u64) % shard_count as u64) as usize
    }

    /// Validates a creation against this view; returns the new topic.
    pub fn plan_create(
        &self,
        spec: &TopicSpec,
        base: &LogConfig,
        live_brokers: usize,
    ) -> Result<TopicMeta, AdminError> {
        validate_name(&spec.name)?;
        if self.topics.contains_key(&spec.name) {
            return Err(AdminError::new(
                ErrorCode::TopicAlreadyExists,
                format!("topic {} already exists", spec.name),
            ));
        }
        if spec.partitions < 1 || spec.partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(AdminError::new(
                ErrorCode::InvalidPartitions,
                format!("partitions must be within 1..={PARTITIONS_PER_TOPIC_MAX}"),
            ));
        }
        if spec.replication_factor < 1 || spec.replication_factor as usize > live_brokers {
            return Err(AdminError::new(
                ErrorCode::InvalidReplicationFactor,
                format!(
                    "replication factor {} exceeds the {live_brokers} available broker(s)",
                    spec.replication_factor
                ),
            ));
        }
        if spec.configs.len() > TOPIC_CONFIGS_MAX {
            return Err(AdminError::new(
                ErrorCode::InvalidConfig,
                "too many config entries",
            ));
        }
        topic_log_config(base, &spec.configs)?;
        Ok(TopicMeta {
            id: self.next_topic_id,
            name: spec.name.clone(),
            partitions: spec.partitions,
            replication_factor: spec.replication_factor,
            configs: spec.configs.clone(),
        })
    }

    pub fn apply_create(&mut self, topic: TopicMeta) {
        self.next_topic_id = self.next_topic_id.max(topic.id + 1);
        self.topics.insert(topic.name.clone(), topic);
    }

    pub fn apply_delete(&mut self, name: &str) -> Option<TopicMeta> {
        self.topics.remove(name)
    }
}

pub fn validate_name(name: &str) -> Result<(), AdminError> {
    let ok = !name.is_empty()
        && name.len() <= TOPIC_NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(AdminError::new(
            ErrorCode::InvalidTopicName,
            format!("topic name {name:?} must be 1..={TOPIC_NAME_BYTES_MAX} of [A-Za-z0-9._-]"),
        ))
    }
}

/// The log settings of a topic: broker defaults overridden by the topic's
/// configs. Keys follow Kafka's names.
pub fn topic_log_config(
    base: &LogConfig,
    configs: &BTreeMap<String, String>,
) -> Result<LogConfig, AdminError> {
    let mut config = base.clone();
    for (key, value) in configs {
        let invalid =
            |why: &str| AdminError::new(ErrorCode::InvalidConfig, format!("{key}={value}: {why}"));
        let number = || value.parse::<i64>().map_err(|_| invalid("not an integer"));
        match key.as_str() {
            "retention.ms" => config.retention_ms = Some(number()?).filter(|ms| *ms >= 0),
            "retention.bytes" => config.retention_bytes = u64::try_from(number()?).ok(),
            "segment.bytes" => {
                config.segment_size_bytes =
                    u64::try_from(number()?).map_err(|_| invalid("negative"))?
            }
            "segment.ms" => config.segment_age_ms = number()?,
            "flush.policy" => {
                config.flush_policy = value.parse::<FlushPolicy>().map_err(|e| invalid(&e))?
            }
            "max.message.bytes" => {
                config.batch_bytes_max =
                    usize::try_from(number()?).map_err(|_| invalid("negative"))?
            }
            _ => return Err(invalid("unknown config key")),
        }
    }
    config
        .validate()
        .map_err(|e| AdminError::new(ErrorCode::InvalidConfig, e.to_string()))?;
    Ok(config)
}

/// Directory of one partition replica under the data dir.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: i32) -> PathBuf {
    data_dir.join("topics").join(format!("{topic}-{partition}"))
}

/// Durable single-node metadata: `DATA_DIR/metadata.json`, replaced atomically.
#[derive(Debug)]
pub struct MetadataStore {
    path: PathBuf,
}

impl MetadataStore {
    pub fn new(data_dir: &Path) -> MetadataStore {
        MetadataStore {
            path: data_dir.join("metadata.json"),
        }
    }

    pub fn load(&self) -> std::io::Result<ClusterView> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", self.path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClusterView::default()),
            Err(e) => Err(e),
        }
    }

    /// Writes the view durably: temp file, fsync, rename, fsync directory. Small
    /// and rare (topic admin only), so blocking I/O is acceptable here.
    pub fn save(&self, view: &ClusterView) -> std::io::Result<()> {
        use std::io::Write;
        let dir = self.path.parent().expect("metadata path has a parent");
        std::fs::create_dir_all(dir)?;
        let tmp = self.path.with_extension("json.tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(view).map_err(std::io::Error::other)?)?;
        file.sync_data()?;
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, partitions: i32) -> TopicSpec {
        TopicSpec {
            name: name.into(),
            partitions,
            replication_factor: 1,
            configs: BTreeMap::new(),
        }
    }

    #[test]
    fn create_validates_and_assigns_ids() {
        let mut view = ClusterView::default();
        let base = LogConfig::default();
        let topic = view.plan_create(&spec("orders", 3), &base, 1).unwrap();
        view.apply_create(topic);
        assert_eq!(
            view.plan_create(&spec("orders", 3), &base, 1)
                .unwrap_err()
                .code,
            ErrorCode::TopicAlreadyExists
        );
        assert_eq!(
            view.plan_create(&spec("bad/name", 3), &base, 1)
                .unwrap_err()
                .code,
            ErrorCode::InvalidTopicName
        );
        assert_eq!(
            view.plan_create(&spec("zero", 0), &base, 1)
                .unwrap_err()
                .code,
            ErrorCode::InvalidPartitions
        );
        let rf3 = TopicSpec {
            replication_factor: 3,
            ..spec("rf3", 1)
        };
        assert_eq!(
            view.plan_create(&rf3, &base, 1).unwrap_err().code,
            ErrorCode::InvalidReplicationFactor
        );
        let mut configs = BTreeMap::new();
        configs.insert("retention.ms".to_string(), "soon".to_string());
        let bad = TopicSpec {
            configs,
            ..spec("cfg", 1)
        };
        assert_eq!(
            view.plan_create(&bad, &base, 1).unwrap_err().code,
            ErrorCode::InvalidConfig
        );
        assert_eq!(view.plan_create(&spec("next", 1), &base, 1).unwrap().id, 1);
    }

    #[test]
    fn partitions_spread_over_shards() {
        let shards: Vec<usize> = (0..4).map(|p| ClusterView::shard_for(7, p, 2)).collect();
        assert_eq!(shards, vec![1, 0, 1, 0]);
    }

    #[test]
    fn topic_configs_override_defaults() {
        let mut configs = BTreeMap::new();
        configs.insert("flush.policy".to_string(), "none".to_string());
        configs.insert("retention.bytes".to_string(), "1000000".to_string());
        let config = topic_log_config(&LogConfig::default(), &configs).unwrap();
        assert_eq!(config.flush_policy, FlushPolicy::None);
        assert_eq!(config.retention_bytes, Some(1_000_000));
    }
}
