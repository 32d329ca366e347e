//! Stable numeric error codes of the wire protocol, kept apart from internal
//! error types. A retired code is never reused; new codes are appended.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    None = 0,
    Unknown = 1,
    CorruptMessage = 2,
    UnknownTopicOrPartition = 3,
    OffsetOutOfRange = 4,
    InvalidRequest = 5,
    UnsupportedVersion = 6,
    MessageTooLarge = 7,
    TopicAlreadyExists = 8,
    InvalidPartitions = 9,
    InvalidReplicationFactor = 10,
    InvalidConfig = 11,
    NotLeaderOrFollower = 12,
    RequestTimedOut = 13,
    StorageError = 14,
    StaleLeaderEpoch = 15,
    NotEnoughReplicas = 16,
    InvalidTopicName = 17,
    UnsupportedCompression = 18,
    ShuttingDown = 19,
    PolicyViolation = 20,
    /// The request reached a controller that is not the Raft leader; the
    /// response names the leader's endpoint when known.
    NotController = 21,
    /// acks=all: the records reached every in-sync replica, but the ISR had
    /// shrunk below `min.insync.replicas` by then; not acknowledged.
    NotEnoughReplicasAfterAppend = 22,
    /// A record the topic cannot take, such as one without a key on a
    /// compacted topic; the message names the reason.
    InvalidRecord = 23,
    /// The request for a consumer group reached a broker that is not its
    /// coordinator; find the coordinator again and retry.
    NotCoordinator = 24,
    /// The coordinator is still loading its groups from `__consumer_offsets`.
    CoordinatorLoadInProgress = 25,
    /// No broker leads the group's `__consumer_offsets` partition right now.
    CoordinatorNotAvailable = 26,
    /// The group has no member with this id (it left, or its session expired).
    UnknownMemberId = 27,
    /// The member's epoch is not the coordinator's: the member must rejoin
    /// with epoch 0, giving up its partitions.
    FencedMemberEpoch = 28,
    /// An offset commit carried an older member epoch and a partition the
    /// member no longer owns.
    StaleMemberEpoch = 29,
    /// No such group.
    GroupIdNotFound = 30,
    /// The operation needs a group without members.
    NonEmptyGroup = 31,
    /// A group id that is empty or too long.
    InvalidGroupId = 32,
    /// The group already has `MEMBERS_PER_GROUP_MAX` members.
    GroupMaxSizeReached = 33,
    /// The member asked for an assignor the coordinator does not have.
    UnsupportedAssignor = 34,
    /// Offsets of a topic that a member of the group subscribes to cannot be
    /// deleted.
    GroupSubscribedToTopic = 35,
    /// A static member joined with an instance id that a live member still
    /// holds; retry after that member left (epoch -2) or its session ended.
    UnreleasedInstanceId = 36,
    /// An idempotent producer's batch does not follow its previous one in
    /// this partition (a gap or a batch older than the last five): the
    /// producer must start again with a new producer id or epoch.
    OutOfOrderSequenceNumber = 37,
    /// The batch carries an older epoch of its producer id than this
    /// partition has seen: another instance took the id over.
    InvalidProducerEpoch = 38,
    /// The batch does not fit the producer's transaction state here: a
    /// plain batch while its transaction is open, or a transactional batch
    /// without a producer id and epoch.
    InvalidTxnState = 39,
    /// A transaction marker from a coordinator older than the one this
    /// partition last heard: that coordinator lost its role.
    TransactionCoordinatorFenced = 40,
    /// The transaction is being committed or aborted: retry shortly.
    ConcurrentTransactions = 41,
    /// Another producer instance took the transactional id over (a newer
    /// epoch): this one must stop.
    ProducerFenced = 42,
    /// The producer id does not match the transactional id's.
    InvalidProducerIdMapping = 43,
    /// The transaction timeout is outside the coordinator's bounds.
    InvalidTransactionTimeout = 44,
    /// The coordinator holds no such transactional id.
    TransactionalIdNotFound = 45,
    /// Offsets of the partition were committed in a transaction not yet
    /// decided: retry.
    UnstableOffsetCommit = 46,
    /// The partition does not know the idempotent producer (new here, or
    /// its state expired) and the batch does not start at sequence 0: the
    /// producer numbers its unanswered batches for this partition again
    /// from 0.
    UnknownProducerId = 47,
    /// A leader new in its epoch has not yet learned that its ISR holds
    /// everything it inherited (its high watermark is below the start of its
    /// epoch), so the latest offset it would give could be behind one a
    /// consumer already saw: retry shortly.
    OffsetNotAvailable = 48,
}

impl ErrorCode {
    const ALL: [ErrorCode; 49] = [
        ErrorCode::None,
        ErrorCode::Unknown,
        ErrorCode::CorruptMessage,
        ErrorCode::UnknownTopicOrPartition,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::InvalidRequest,
        ErrorCode::UnsupportedVersion,
        ErrorCode::MessageTooLarge,
        ErrorCode::TopicAlreadyExists,
        ErrorCode::InvalidPartitions,
        ErrorCode::InvalidReplicationFactor,
        ErrorCode::InvalidConfig,
        ErrorCode::NotLeaderOrFollower,
        ErrorCode::RequestTimedOut,
        ErrorCode::StorageError,
        ErrorCode::StaleLeaderEpoch,
        ErrorCode::NotEnoughReplicas,
        ErrorCode::InvalidTopicName,
        ErrorCode::UnsupportedCompression,
        ErrorCode::ShuttingDown,
        ErrorCode::PolicyViolation,
        ErrorCode::NotController,
        ErrorCode::NotEnoughReplicasAfterAppend,
        ErrorCode::InvalidRecord,
        ErrorCode::NotCoordinator,
        ErrorCode::CoordinatorLoadInProgress,
        ErrorCode::CoordinatorNotAvailable,
        ErrorCode::UnknownMemberId,
        ErrorCode::FencedMemberEpoch,
        ErrorCode::StaleMemberEpoch,
        ErrorCode::GroupIdNotFound,
        ErrorCode::NonEmptyGroup,
        ErrorCode::InvalidGroupId,
        ErrorCode::GroupMaxSizeReached,
        ErrorCode::UnsupportedAssignor,
        ErrorCode::GroupSubscribedToTopic,
        ErrorCode::UnreleasedInstanceId,
        ErrorCode::OutOfOrderSequenceNumber,
        ErrorCode::InvalidProducerEpoch,
        ErrorCode::InvalidTxnState,
        ErrorCode::TransactionCoordinatorFenced,
        ErrorCode::ConcurrentTransactions,
        ErrorCode::ProducerFenced,
        ErrorCode::InvalidProducerIdMapping,
        ErrorCode::InvalidTransactionTimeout,
        ErrorCode::TransactionalIdNotFound,
        ErrorCode::UnstableOffsetCommit,
        ErrorCode::UnknownProducerId,
        ErrorCode::OffsetNotAvailable,
    ];

    /// Unknown numbers (from a newer peer) map to `Unknown`.
    pub fn from_u16(code: u16) -> ErrorCode {
        ErrorCode::ALL
            .into_iter()
            .find(|c| *c as u16 == code)
            .unwrap_or(ErrorCode::Unknown)
    }

    pub fn code(self) -> u16 {
        self as u16
    }

    pub fn is_ok(self) -> bool {
        self == ErrorCode::None
    }

    /// Whether a client may retry the same request and expect success.
    pub fn is_retriable(self) -> bool {
        matches!(
            self,
            ErrorCode::NotLeaderOrFollower
                | ErrorCode::RequestTimedOut
                | ErrorCode::NotEnoughReplicas
                | ErrorCode::NotEnoughReplicasAfterAppend
                | ErrorCode::UnknownTopicOrPartition
                | ErrorCode::ShuttingDown
                | ErrorCode::StorageError
                | ErrorCode::NotController
                | ErrorCode::NotCoordinator
                | ErrorCode::CoordinatorLoadInProgress
                | ErrorCode::CoordinatorNotAvailable
                | ErrorCode::ConcurrentTransactions
                | ErrorCode::UnstableOffsetCommit
                | ErrorCode::OffsetNotAvailable
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::None => "NONE",
            ErrorCode::Unknown => "UNKNOWN",
            ErrorCode::CorruptMessage => "CORRUPT_MESSAGE",
            ErrorCode::UnknownTopicOrPartition => "UNKNOWN_TOPIC_OR_PARTITION",
            ErrorCode::OffsetOutOfRange => "OFFSET_OUT_OF_RANGE",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::UnsupportedVersion => "UNSUPPORTED_VERSION",
            ErrorCode::MessageTooLarge => "MESSAGE_TOO_LARGE",
            ErrorCode::TopicAlreadyExists => "TOPIC_ALREADY_EXISTS",
            ErrorCode::InvalidPartitions => "INVALID_PARTITIONS",
            ErrorCode::InvalidReplicationFactor => "INVALID_REPLICATION_FACTOR",
            ErrorCode::InvalidConfig => "INVALID_CONFIG",
            ErrorCode::NotLeaderOrFollower => "NOT_LEADER_OR_FOLLOWER",
            ErrorCode::RequestTimedOut => "REQUEST_TIMED_OUT",
            ErrorCode::StorageError => "STORAGE_ERROR",
            ErrorCode::StaleLeaderEpoch => "STALE_LEADER_EPOCH",
            ErrorCode::NotEnoughReplicas => "NOT_ENOUGH_REPLICAS",
            ErrorCode::InvalidTopicName => "INVALID_TOPIC_NAME",
            ErrorCode::UnsupportedCompression => "UNSUPPORTED_COMPRESSION",
            ErrorCode::ShuttingDown => "SHUTTING_DOWN",
            ErrorCode::PolicyViolation => "POLICY_VIOLATION",
            ErrorCode::NotController => "NOT_CONTROLLER",
            ErrorCode::NotEnoughReplicasAfterAppend => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
            ErrorCode::InvalidRecord => "INVALID_RECORD",
            ErrorCode::NotCoordinator => "NOT_COORDINATOR",
            ErrorCode::CoordinatorLoadInProgress => "COORDINATOR_LOAD_IN_PROGRESS",
            ErrorCode::CoordinatorNotAvailable => "COORDINATOR_NOT_AVAILABLE",
            ErrorCode::UnknownMemberId => "UNKNOWN_MEMBER_ID",
            ErrorCode::FencedMemberEpoch => "FENCED_MEMBER_EPOCH",
            ErrorCode::StaleMemberEpoch => "STALE_MEMBER_EPOCH",
            ErrorCode::GroupIdNotFound => "GROUP_ID_NOT_FOUND",
            ErrorCode::NonEmptyGroup => "NON_EMPTY_GROUP",
            ErrorCode::InvalidGroupId => "INVALID_GROUP_ID",
            ErrorCode::GroupMaxSizeReached => "GROUP_MAX_SIZE_REACHED",
            ErrorCode::UnsupportedAssignor => "UNSUPPORTED_ASSIGNOR",
            ErrorCode::GroupSubscribedToTopic => "GROUP_SUBSCRIBED_TO_TOPIC",
            ErrorCode::UnreleasedInstanceId => "UNRELEASED_INSTANCE_ID",
            ErrorCode::OutOfOrderSequenceNumber => "OUT_OF_ORDER_SEQUENCE_NUMBER",
            ErrorCode::InvalidProducerEpoch => "INVALID_PRODUCER_EPOCH",
            ErrorCode::InvalidTxnState => "INVALID_TXN_STATE",
            ErrorCode::TransactionCoordinatorFenced => "TRANSACTION_COORDINATOR_FENCED",
            ErrorCode::ConcurrentTransactions => "CONCURRENT_TRANSACTIONS",
            ErrorCode::ProducerFenced => "PRODUCER_FENCED",
            ErrorCode::InvalidProducerIdMapping => "INVALID_PRODUCER_ID_MAPPING",
            ErrorCode::InvalidTransactionTimeout => "INVALID_TRANSACTION_TIMEOUT",
            ErrorCode::TransactionalIdNotFound => "TRANSACTIONAL_ID_NOT_FOUND",
            ErrorCode::UnstableOffsetCommit => "UNSTABLE_OFFSET_COMMIT",
            ErrorCode::UnknownProducerId => "UNKNOWN_PRODUCER_ID",
            ErrorCode::OffsetNotAvailable => "OFFSET_NOT_AVAILABLE",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_stable() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u16(code.code()), code);
        }
        // Wire numbers are a contract: pin a few.
        assert_eq!(ErrorCode::OffsetOutOfRange.code(), 4);
        assert_eq!(ErrorCode::StorageError.code(), 14);
        assert_eq!(ErrorCode::from_u16(60_000), ErrorCode::Unknown);
    }
}
