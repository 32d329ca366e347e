//! The broker's read-only picture of cluster metadata as the controller
//! publishes it: brokers with their endpoints, topics with their partitions'
//! replicas (broker and shard), leader, leader epoch and ISR. Every shard keeps
//! its own copy and changes it only by applying the same controller updates
//! (deltas or a whole image), which shard 0 fetches and passes to every shard.
//! Applying an update is a pure function, tested here without I/O.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use protocol::control::messages::{BrokerView, DeltaView, ImageView, MetadataUpdate};
use protocol::control::records::{PartitionRecord, TopicRecord};
use protocol::ErrorCode;
use protocol::{BrokerId, MetadataVersion, TopicId};

use crate::log::{CleanupPolicy, FlushPolicy, LogConfig};

/// Longest topic name: it becomes a directory name with a partition suffix.
pub const TOPIC_NAME_BYTES_MAX: usize = 200;
/// Partitions of one topic.
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 10_000;
/// Topic config entries in one request.
pub const TOPIC_CONFIGS_MAX: usize = 64;
/// Topic config: in-sync replicas acks=all needs.
pub const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";

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

impl TopicSpec {
    /// What the broker can check before asking the controller: the name, the
    /// partition count and that the configs make a valid log config here.
    pub fn validate(&self, base: &LogConfig) -> Result<(), AdminError> {
        validate_name(&self.name)?;
        if self.partitions < 1 || self.partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(AdminError::new(
                ErrorCode::InvalidPartitions,
                format!("partitions must be within 1..={PARTITIONS_PER_TOPIC_MAX}"),
            ));
        }
        if self.replication_factor < 1 {
            return Err(AdminError::new(
                ErrorCode::InvalidReplicationFactor,
                "replication factor must be at least 1",
            ));
        }
        if self.configs.len() > TOPIC_CONFIGS_MAX {
            return Err(AdminError::new(
                ErrorCode::InvalidConfig,
                "too many config entries",
            ));
        }
        topic_log_config(base, &self.configs).map(|_| ())
    }
}

/// One replica of a partition as a broker routes to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub shard: usize,
    pub leader: bool,
    pub leader_epoch: i32,
}

/// An update that cannot be applied: the view is left as it was and the
/// caller must load the whole image.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("delta for unknown topic id {0}")]
    UnknownTopic(u64),
    #[error("delta for partition {partition} of topic id {topic_id}, which has fewer")]
    UnknownPartition { topic_id: u64, partition: u32 },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub version: MetadataVersion,
    pub brokers: BTreeMap<BrokerId, BrokerView>,
    pub topics: BTreeMap<String, TopicRecord>,
    names_by_id: BTreeMap<TopicId, String>,
}

impl ClusterView {
    pub fn topic(&self, name: &str) -> Option<&TopicRecord> {
        self.topics.get(name)
    }

    pub fn partition(&self, name: &str, partition: i32) -> Option<&PartitionRecord> {
        let index = usize::try_from(partition).ok()?;
        self.topics.get(name)?.partitions.get(index)
    }

    /// Whether this view holds broker `me`'s registration at `epoch`.
    pub fn knows_registration(&self, me: BrokerId, epoch: u64) -> bool {
        epoch != 0 && self.brokers.get(&me).is_some_and(|b| b.epoch.0 == epoch)
    }

    /// Whether this view holds broker `me` at `epoch`, unfenced.
    pub fn is_registered_and_unfenced(&self, me: BrokerId, epoch: u64) -> bool {
        self.knows_registration(me, epoch) && self.brokers.get(&me).is_some_and(|b| !b.fenced)
    }

    /// Where broker `me` holds `partition` of `name`, and whether it leads it.
    pub fn placement(
        &self,
        me: BrokerId,
        name: &str,
        partition: i32,
    ) -> Result<Placement, AdminError> {
        let record = self.partition(name, partition).ok_or_else(|| {
            AdminError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("no partition {name}-{partition}"),
            )
        })?;
        let replica = record.replica_on(me).ok_or_else(|| {
            AdminError::new(
                ErrorCode::NotLeaderOrFollower,
                format!("broker {me} holds no replica of {name}-{partition}"),
            )
        })?;
        Ok(Placement {
            shard: usize::from(replica.shard.0),
            leader: record.leader == Some(me),
            leader_epoch: record.leader_epoch.0,
        })
    }

    /// Applies a controller update. Deltas at or below the view's version are
    /// skipped, so an update may be applied twice, and an update older than
    /// the view (from a new controller leader still applying its log) is
    /// ignored rather than moving the view back. On error nothing changed.
    pub fn apply(&mut self, update: MetadataUpdate) -> Result<(), ViewError> {
        match update {
            MetadataUpdate::Image(image) => {
                if image.metadata_version >= self.version {
                    self.load(image);
                }
                Ok(())
            }
            MetadataUpdate::Deltas {
                metadata_version,
                deltas,
            } => {
                if metadata_version < self.version {
                    return Ok(());
                }
                let mut next = self.clone();
                for (version, delta) in deltas {
                    if version > self.version {
                        next.apply_delta(delta)?;
                    }
                }
                next.version = metadata_version;
                *self = next;
                Ok(())
            }
        }
    }

    fn load(&mut self, image: ImageView) {
        self.version = image.metadata_version;
        self.brokers = image.brokers.into_iter().map(|b| (b.id, b)).collect();
        self.names_by_id = image
            .topics
            .iter()
            .map(|t| (t.id, t.name.clone()))
            .collect();
        self.topics = image
            .topics
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
    }

    fn apply_delta(&mut self, delta: DeltaView) -> Result<(), ViewError> {
        match delta {
            DeltaView::BrokerRegistered(broker) => {
                self.brokers.insert(broker.id, broker);
            }
            DeltaView::BrokerFenced(id) => {
                if let Some(b) = self.brokers.get_mut(&id) {
                    b.fenced = true;
                }
            }
            DeltaView::BrokerUnfenced(id) => {
                if let Some(b) = self.brokers.get_mut(&id) {
                    b.fenced = false;
                }
            }
            DeltaView::TopicCreated(topic) => {
                self.names_by_id.insert(topic.id, topic.name.clone());
                self.topics.insert(topic.name.clone(), topic);
            }
            DeltaView::TopicDeleted { topic_id, .. } => {
                if let Some(name) = self.names_by_id.remove(&topic_id) {
                    self.topics.remove(&name);
                }
            }
            DeltaView::PartitionChanged {
                topic_id,
                partition,
                record,
            } => {
                let name = self
                    .names_by_id
                    .get(&topic_id)
                    .ok_or(ViewError::UnknownTopic(topic_id.0))?;
                let topic = self.topics.get_mut(name).expect("names_by_id is in sync");
                let slot = topic.partitions.get_mut(partition.0 as usize).ok_or(
                    ViewError::UnknownPartition {
                        topic_id: topic_id.0,
                        partition: partition.0,
                    },
                )?;
                *slot = record;
            }
            DeltaView::TopicConfigChanged { topic_id, config } => {
                let name = self
                    .names_by_id
                    .get(&topic_id)
                    .ok_or(ViewError::UnknownTopic(topic_id.0))?;
                let topic = self.topics.get_mut(name).expect("names_by_id is in sync");
                topic.config = config;
            }
        }
        Ok(())
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

/// A ratio such as `0.5` in thousandths, rounded down; `None` outside 0..=1.
fn parse_ratio_permille(text: &str) -> Option<u32> {
    let ratio: f64 = text.trim().parse().ok()?;
    (0.0..=1.0)
        .contains(&ratio)
        .then(|| (ratio * 1000.0).floor() as u32)
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
            "cleanup.policy" => {
                config.cleanup_policy = value.parse::<CleanupPolicy>().map_err(|e| invalid(&e))?
            }
            "min.cleanable.dirty.ratio" => {
                config.min_cleanable_dirty_ratio_permille = parse_ratio_permille(value)
                    .ok_or_else(|| invalid("expected a number within 0..=1"))?
            }
            "min.compaction.lag.ms" => config.min_compaction_lag_ms = number()?,
            "max.compaction.lag.ms" => config.max_compaction_lag_ms = number()?,
            "delete.retention.ms" => config.delete_retention_ms = number()?,
            // Read by the controller, not the log.
            protocol::control::records::UNCLEAN_LEADER_ELECTION_ENABLE => match value.as_str() {
                "true" | "false" => {}
                _ => return Err(invalid("expected true or false")),
            },
            MIN_INSYNC_REPLICAS => {
                if number()? < 1 {
                    return Err(invalid("must be at least 1"));
                }
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

/// `min.insync.replicas` of a topic, 1 when unset.
pub fn min_insync(config: &BTreeMap<String, String>) -> usize {
    config
        .get(MIN_INSYNC_REPLICAS)
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Directory holding every partition replica under the data dir. The broker
/// creates it durably before any shard starts, so shards opening replicas
/// at once never race to create it (one of them would find it present and
/// return before the other made its entry durable).
pub fn topics_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("topics")
}

/// Directory of one partition replica under the data dir.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: i32) -> PathBuf {
    topics_dir(data_dir).join(format!("{topic}-{partition}"))
}

#[cfg(test)]
mod tests {
    use protocol::control::records::{BrokerEndpoints, Replica};
    use protocol::{BrokerEpoch, LeaderEpoch, PartitionEpoch, PartitionIndex, ShardIndex};

    use super::*;

    fn spec(name: &str, partitions: i32) -> TopicSpec {
        TopicSpec {
            name: name.into(),
            partitions,
            replication_factor: 1,
            configs: BTreeMap::new(),
        }
    }

    fn broker(id: u32) -> BrokerView {
        BrokerView {
            id: BrokerId(id),
            epoch: BrokerEpoch(1),
            endpoints: BrokerEndpoints {
                client: format!("127.0.0.1:{}", 9000 + id),
                shards: vec![format!("127.0.0.1:{}", 9100 + id)],
            },
            fenced: false,
        }
    }

    fn partition(replicas: &[u32], leader: Option<u32>, epoch: i32) -> PartitionRecord {
        PartitionRecord {
            replicas: replicas
                .iter()
                .map(|&b| Replica {
                    broker_id: BrokerId(b),
                    shard: ShardIndex(0),
                })
                .collect(),
            isr: replicas.iter().map(|&b| BrokerId(b)).collect(),
            leader: leader.map(BrokerId),
            leader_epoch: LeaderEpoch(epoch),
            partition_epoch: PartitionEpoch(epoch),
        }
    }

    fn topic(id: u64, name: &str) -> TopicRecord {
        TopicRecord {
            id: TopicId(id),
            name: name.into(),
            replication_factor: 2,
            config: BTreeMap::new(),
            partitions: vec![
                partition(&[1, 2], Some(1), 0),
                partition(&[2, 1], Some(2), 0),
            ],
        }
    }

    fn deltas(version: u64, list: Vec<DeltaView>) -> MetadataUpdate {
        MetadataUpdate::Deltas {
            metadata_version: MetadataVersion(version),
            deltas: list
                .into_iter()
                .map(|d| (MetadataVersion(version), d))
                .collect(),
        }
    }

    #[test]
    fn deltas_build_the_same_view_as_the_image() {
        let mut view = ClusterView::default();
        view.apply(deltas(1, vec![DeltaView::BrokerRegistered(broker(1))]))
            .unwrap();
        view.apply(deltas(2, vec![DeltaView::BrokerRegistered(broker(2))]))
            .unwrap();
        view.apply(deltas(3, vec![DeltaView::TopicCreated(topic(7, "t"))]))
            .unwrap();
        // Broker 1 fails: partition 0 moves to broker 2 with a higher epoch.
        view.apply(deltas(
            4,
            vec![
                DeltaView::BrokerFenced(BrokerId(1)),
                DeltaView::PartitionChanged {
                    topic_id: TopicId(7),
                    partition: PartitionIndex(0),
                    record: partition(&[1, 2], Some(2), 1),
                },
            ],
        ))
        .unwrap();
        // Applying an old update again changes nothing.
        view.apply(deltas(3, vec![DeltaView::TopicCreated(topic(7, "t"))]))
            .unwrap();
        let p0 = view.placement(BrokerId(2), "t", 0).unwrap();
        assert!(p0.leader);
        assert_eq!(p0.leader_epoch, 1);
        assert!(!view.placement(BrokerId(1), "t", 0).unwrap().leader);
        assert_eq!(
            view.placement(BrokerId(3), "t", 0).unwrap_err().code,
            ErrorCode::NotLeaderOrFollower
        );
        assert_eq!(
            view.placement(BrokerId(1), "t", 2).unwrap_err().code,
            ErrorCode::UnknownTopicOrPartition
        );

        let mut fenced = broker(1);
        fenced.fenced = true;
        let mut moved = topic(7, "t");
        moved.partitions[0] = partition(&[1, 2], Some(2), 1);
        let mut from_image = ClusterView::default();
        from_image
            .apply(MetadataUpdate::Image(ImageView {
                metadata_version: MetadataVersion(4),
                brokers: vec![fenced, broker(2)],
                topics: vec![moved],
            }))
            .unwrap();
        assert_eq!(view, from_image);

        view.apply(deltas(
            5,
            vec![DeltaView::TopicDeleted {
                topic_id: TopicId(7),
                name: "t".into(),
            }],
        ))
        .unwrap();
        assert!(view.topic("t").is_none());
        assert_eq!(view.version, MetadataVersion(5));
    }

    #[test]
    fn a_bad_update_changes_nothing() {
        let mut view = ClusterView::default();
        view.apply(deltas(3, vec![DeltaView::TopicCreated(topic(7, "t"))]))
            .unwrap();
        let before = view.clone();
        let bad = deltas(
            4,
            vec![
                DeltaView::BrokerRegistered(broker(1)),
                DeltaView::PartitionChanged {
                    topic_id: TopicId(7),
                    partition: PartitionIndex(9),
                    record: partition(&[1], Some(1), 1),
                },
            ],
        );
        assert!(matches!(
            view.apply(bad),
            Err(ViewError::UnknownPartition { .. })
        ));
        assert_eq!(view, before);
        // An older image does not move the view back.
        view.apply(MetadataUpdate::Image(ImageView {
            metadata_version: MetadataVersion(2),
            brokers: vec![],
            topics: vec![],
        }))
        .unwrap();
        assert_eq!(view, before);
    }

    #[test]
    fn specs_are_checked_before_asking_the_controller() {
        let base = LogConfig::default();
        assert!(spec("orders", 3).validate(&base).is_ok());
        assert_eq!(
            spec("bad/name", 3).validate(&base).unwrap_err().code,
            ErrorCode::InvalidTopicName
        );
        assert_eq!(
            spec("zero", 0).validate(&base).unwrap_err().code,
            ErrorCode::InvalidPartitions
        );
        let mut configs = BTreeMap::new();
        configs.insert("retention.ms".to_string(), "soon".to_string());
        let bad = TopicSpec {
            configs,
            ..spec("cfg", 1)
        };
        assert_eq!(
            bad.validate(&base).unwrap_err().code,
            ErrorCode::InvalidConfig
        );
    }

    #[test]
    fn topic_configs_override_defaults() {
        let mut configs = BTreeMap::new();
        configs.insert("flush.policy".to_string(), "none".to_string());
        configs.insert("retention.bytes".to_string(), "1000000".to_string());
        configs.insert(
            "unclean.leader.election.enable".to_string(),
            "false".to_string(),
        );
        let config = topic_log_config(&LogConfig::default(), &configs).unwrap();
        assert_eq!(config.flush_policy, FlushPolicy::None);
        assert_eq!(config.retention_bytes, Some(1_000_000));
    }

    #[test]
    fn compaction_configs_parse_and_are_bounded() {
        let configs: BTreeMap<String, String> = [
            ("cleanup.policy", "compact,delete"),
            ("min.cleanable.dirty.ratio", "0.25"),
            ("min.compaction.lag.ms", "1000"),
            ("max.compaction.lag.ms", "60000"),
            ("delete.retention.ms", "5000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = topic_log_config(&LogConfig::default(), &configs).unwrap();
        assert_eq!(
            config.cleanup_policy,
            CleanupPolicy {
                delete: true,
                compact: true
            }
        );
        assert_eq!(config.min_cleanable_dirty_ratio_permille, 250);
        assert_eq!(
            (config.min_compaction_lag_ms, config.max_compaction_lag_ms),
            (1000, 60000)
        );
        assert_eq!(config.delete_retention_ms, 5000);
        for (key, value) in [
            ("cleanup.policy", "shred"),
            ("min.cleanable.dirty.ratio", "1.5"),
            ("min.compaction.lag.ms", "-1"),
            ("delete.retention.ms", "soon"),
            ("max.compaction.lag.ms", "10"),
        ] {
            let mut bad = configs.clone();
            bad.insert(key.to_string(), value.to_string());
            let error = topic_log_config(&LogConfig::default(), &bad).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidConfig, "{key}={value}");
        }
    }
}
