//! `Admin`: topic management and cluster inspection (create, delete, list,
//! describe, metadata). Requests go to any reachable broker.

use std::sync::Arc;

use protocol::{ApiKey, ErrorCode};

use crate::cluster::Cluster;
use crate::config::ClientConfig;
use crate::error::Result;
use crate::messages;
use crate::metadata::ClusterMetadata;

/// A topic as `list_topics` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSummary {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
}

/// One partition as `describe_topic` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: i32,
    pub error: ErrorCode,
    /// Node id, -1 without a leader.
    pub leader: i32,
    pub leader_epoch: i32,
    pub shard: u16,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub size_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partition_count: i32,
    pub replication_factor: i16,
    /// Key/value strings, e.g. `retention.ms`, `flush.policy`.
    pub configs: Vec<(String, String)>,
    pub partitions: Vec<PartitionDescription>,
}

/// Administrative client; cheap to clone.
#[derive(Clone, Debug)]
pub struct Admin {
    cluster: Cluster,
}

impl Admin {
    pub async fn connect(bootstrap: &str, config: ClientConfig) -> Result<Admin> {
        Ok(Admin::from_cluster(
            Cluster::connect(bootstrap, config).await?,
        ))
    }

    pub fn from_cluster(cluster: Cluster) -> Admin {
        Admin { cluster }
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Creates a topic. `configs` are key/value strings the broker validates
    /// (retention.ms, retention.bytes, segment.bytes, segment.ms, flush.policy).
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &[(String, String)],
    ) -> Result<()> {
        let body = messages::create_topics_request(name, partitions, replication_factor, configs);
        let response = self
            .cluster
            .request_any(ApiKey::CreateTopics, &body)
            .await?;
        messages::create_topics_response(response.body(), name)
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let body = messages::delete_topics_request(name);
        let response = self
            .cluster
            .request_any(ApiKey::DeleteTopics, &body)
            .await?;
        messages::delete_topics_response(response.body(), name)
    }

    /// Sets (`set`) and removes (`remove`) keys of a topic's config; removed
    /// keys take the broker default again. The broker checks the resulting
    /// config and answers once its own metadata shows it.
    pub async fn alter_topic_config(
        &self,
        name: &str,
        set: &[(String, String)],
        remove: &[String],
    ) -> Result<()> {
        let body = messages::alter_topic_configs_request(name, set, remove);
        let response = self
            .cluster
            .request_any(ApiKey::AlterTopicConfigs, &body)
            .await?;
        messages::alter_topic_configs_response(response.body(), name)
    }

    pub async fn list_topics(&self) -> Result<Vec<TopicSummary>> {
        let body = messages::list_topics_request();
        let response = self.cluster.request_any(ApiKey::ListTopics, &body).await?;
        messages::list_topics_response(response.body())
    }

    pub async fn describe_topic(&self, name: &str) -> Result<TopicDescription> {
        let body = messages::describe_topic_request(name);
        let response = self
            .cluster
            .request_any(ApiKey::DescribeTopic, &body)
            .await?;
        messages::describe_topic_response(response.body())
    }

    /// Fresh metadata for the whole cluster.
    pub async fn metadata(&self) -> Result<Arc<ClusterMetadata>> {
        self.cluster.refresh_metadata().await
    }
}
