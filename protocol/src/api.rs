//! API keys and the versions this build speaks. Keys are stable wire numbers:
//! a retired key is never reused.

/// Identifies the request type in a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ApiKey {
    ApiVersions = 0,
    Metadata = 1,
    CreateTopics = 2,
    DeleteTopics = 3,
    ListTopics = 4,
    DescribeTopic = 5,
    Produce = 6,
    Fetch = 7,
    ListOffsets = 8,
    /// Served by brokers (forwarded to the controller) and by controllers;
    /// numbered after the controller's keys, which share the number space.
    AlterTopicConfigs = 17,
    /// Served by any broker: where a consumer group's coordinator is.
    FindCoordinator = 18,
    /// The rest of the group APIs are served by the group's coordinator.
    GroupHeartbeat = 19,
    OffsetCommit = 20,
    OffsetFetch = 21,
    ListGroups = 22,
    DescribeGroup = 23,
    DeleteGroup = 24,
    DeleteGroupOffsets = 25,
    /// Served by any broker: a new producer id for an idempotent producer.
    InitProducerId = 27,
    /// Broker to broker: a transaction coordinator has partition leaders
    /// write commit or abort markers.
    WriteTxnMarkers = 28,
    /// Served by a transactional id's coordinator.
    AddPartitionsToTxn = 29,
    EndTxn = 30,
    /// Served by any broker: the transactional ids its coordinators hold.
    ListTransactions = 31,
    DescribeTransaction = 32,
    /// Served by a transactional id's coordinator.
    AddOffsetsToTxn = 33,
    /// Served by a group's coordinator.
    TxnOffsetCommit = 34,
}

impl ApiKey {
    pub const ALL: [ApiKey; 26] = [
        ApiKey::ApiVersions,
        ApiKey::Metadata,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::ListTopics,
        ApiKey::DescribeTopic,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::AlterTopicConfigs,
        ApiKey::FindCoordinator,
        ApiKey::GroupHeartbeat,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ListGroups,
        ApiKey::DescribeGroup,
        ApiKey::DeleteGroup,
        ApiKey::DeleteGroupOffsets,
        ApiKey::InitProducerId,
        ApiKey::WriteTxnMarkers,
        ApiKey::AddPartitionsToTxn,
        ApiKey::EndTxn,
        ApiKey::ListTransactions,
        ApiKey::DescribeTransaction,
        ApiKey::AddOffsetsToTxn,
        ApiKey::TxnOffsetCommit,
    ];

    pub fn from_u16(key: u16) -> Option<ApiKey> {
        ApiKey::ALL.into_iter().find(|k| *k as u16 == key)
    }

    /// Inclusive range of versions this build accepts.
    pub fn versions(self) -> (u16, u16) {
        (0, 0)
    }

    pub fn name(self) -> &'static str {
        match self {
            ApiKey::ApiVersions => "api_versions",
            ApiKey::Metadata => "metadata",
            ApiKey::CreateTopics => "create_topics",
            ApiKey::DeleteTopics => "delete_topics",
            ApiKey::ListTopics => "list_topics",
            ApiKey::DescribeTopic => "describe_topic",
            ApiKey::Produce => "produce",
            ApiKey::Fetch => "fetch",
            ApiKey::ListOffsets => "list_offsets",
            ApiKey::AlterTopicConfigs => "alter_topic_configs",
            ApiKey::FindCoordinator => "find_coordinator",
            ApiKey::GroupHeartbeat => "group_heartbeat",
            ApiKey::OffsetCommit => "offset_commit",
            ApiKey::OffsetFetch => "offset_fetch",
            ApiKey::ListGroups => "list_groups",
            ApiKey::DescribeGroup => "describe_group",
            ApiKey::DeleteGroup => "delete_group",
            ApiKey::DeleteGroupOffsets => "delete_group_offsets",
            ApiKey::InitProducerId => "init_producer_id",
            ApiKey::WriteTxnMarkers => "write_txn_markers",
            ApiKey::AddPartitionsToTxn => "add_partitions_to_txn",
            ApiKey::EndTxn => "end_txn",
            ApiKey::ListTransactions => "list_transactions",
            ApiKey::DescribeTransaction => "describe_transaction",
            ApiKey::AddOffsetsToTxn => "add_offsets_to_txn",
            ApiKey::TxnOffsetCommit => "txn_offset_commit",
        }
    }
}

/// Keys of the controller's APIs (schema/controller.fbs), served only by
/// `ringlog-controller`. A separate enum so that a broker's `ApiKey` matches and
/// its ApiVersions answer stay exactly the broker's APIs; both enums share one
/// number space, so a key number is never used by both. A controller also
/// serves `ApiKey::CreateTopics`, `ApiKey::DeleteTopics` and
/// `ApiKey::AlterTopicConfigs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ControllerApiKey {
    /// A broker process registers and gets its broker epoch.
    RegisterBroker = 9,
    BrokerHeartbeat = 10,
    /// Long poll for metadata deltas since a version, or the whole image.
    FetchMetadata = 11,
    DescribeCluster = 12,
    /// Controller-to-controller Raft RPCs. Their bodies are JSON-encoded
    /// openraft messages, not flatbuffers: internal traffic between
    /// controllers of the same build.
    RaftAppendEntries = 13,
    RaftVote = 14,
    RaftInstallSnapshot = 15,
    /// A partition leader's compare-and-set change of its ISR.
    AlterIsr = 16,
    /// A broker takes the next block of producer ids.
    AllocateProducerIds = 26,
}

impl ControllerApiKey {
    pub const ALL: [ControllerApiKey; 9] = [
        ControllerApiKey::RegisterBroker,
        ControllerApiKey::BrokerHeartbeat,
        ControllerApiKey::FetchMetadata,
        ControllerApiKey::DescribeCluster,
        ControllerApiKey::RaftAppendEntries,
        ControllerApiKey::RaftVote,
        ControllerApiKey::RaftInstallSnapshot,
        ControllerApiKey::AlterIsr,
        ControllerApiKey::AllocateProducerIds,
    ];

    pub fn from_u16(key: u16) -> Option<ControllerApiKey> {
        ControllerApiKey::ALL.into_iter().find(|k| *k as u16 == key)
    }

    /// Inclusive range of versions this build accepts.
    pub fn versions(self) -> (u16, u16) {
        (0, 0)
    }

    pub fn name(self) -> &'static str {
        match self {
            ControllerApiKey::RegisterBroker => "register_broker",
            ControllerApiKey::BrokerHeartbeat => "broker_heartbeat",
            ControllerApiKey::FetchMetadata => "fetch_metadata",
            ControllerApiKey::DescribeCluster => "describe_cluster",
            ControllerApiKey::RaftAppendEntries => "raft_append_entries",
            ControllerApiKey::RaftVote => "raft_vote",
            ControllerApiKey::RaftInstallSnapshot => "raft_install_snapshot",
            ControllerApiKey::AlterIsr => "alter_isr",
            ControllerApiKey::AllocateProducerIds => "allocate_producer_ids",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_and_controller_keys_never_share_a_number() {
        for key in ControllerApiKey::ALL {
            assert_eq!(ApiKey::from_u16(key as u16), None, "{}", key.name());
            assert_eq!(ControllerApiKey::from_u16(key as u16), Some(key));
        }
        assert_eq!(ControllerApiKey::RegisterBroker as u16, 9);
        assert_eq!(ControllerApiKey::RaftInstallSnapshot as u16, 15);
    }
}
