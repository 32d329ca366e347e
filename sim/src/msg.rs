//! What travels between simulated nodes, and the actions a node asks the
//! world for (send a message, set a timer). Nodes never touch the queue or
//! the network themselves: they take an event and return actions.

use broker::replication::follower::LeaderAnswer;
use broker::replication::leader::FollowerFetch;
use controller::command::CommandError;
use protocol::control::records::PartitionRecord;
use protocol::{BrokerEpoch, BrokerId, ErrorCode, LeaderEpoch, MetadataVersion};

use crate::disk::Rec;

/// An addressee. A broker is addressed with the incarnation that sent the
/// request being answered, so an answer never reaches a restarted process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    Controller,
    Broker(BrokerId, u64),
    /// Any live incarnation of this broker (a request, not an answer).
    AnyBroker(BrokerId),
    Client(u32),
}

/// The controller's answer to a heartbeat (as `controller::service` gives it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Session {
    Alive,
    Fenced,
    Unregistered,
}

#[derive(Clone, Debug)]
pub enum Msg {
    Register {
        incarnation: u64,
    },
    Registered(Result<BrokerEpoch, CommandError>),
    Heartbeat {
        epoch: BrokerEpoch,
        ready: bool,
    },
    HeartbeatAnswer(Session),
    FetchMetadata {
        from: MetadataVersion,
    },
    /// A FetchMetadata response exactly as the controller encodes it.
    Metadata(Vec<u8>),
    AlterIsr {
        request_id: u64,
        request: protocol::control::messages::AlterIsr,
    },
    AlterIsrAnswer {
        request_id: u64,
        partition: u32,
        result: Result<PartitionRecord, CommandError>,
    },
    ReplicaFetch {
        request_id: u64,
        partition: u32,
        fetch: FollowerFetch,
        offset: i64,
    },
    ReplicaFetchAnswer {
        request_id: u64,
        partition: u32,
        answer: LeaderAnswer,
        first_offset: i64,
        records: Vec<Rec>,
    },
    Produce {
        request_id: u64,
        partition: u32,
        acks: i16,
        values: Vec<u64>,
    },
    ProduceAnswer {
        request_id: u64,
        result: Result<i64, ErrorCode>,
    },
    Consume {
        request_id: u64,
        partition: u32,
        offset: i64,
    },
    ConsumeAnswer {
        request_id: u64,
        partition: u32,
        result: Result<(i64, Vec<Rec>), ErrorCode>,
    },
    ClientMetadata,
    ClientMetadataAnswer {
        leaders: Vec<Option<BrokerId>>,
    },
}

/// A broker's timers; each belongs to one incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerTimer {
    Heartbeat,
    MetadataPoll,
    IsrCheck,
    Sync { partition: u32 },
    FollowerFetch { partition: u32 },
    FetchTimeout { partition: u32, request_id: u64 },
    ParkExpired { partition: u32, request_id: u64 },
    AckDeadline { partition: u32, request_id: u64 },
    AlterIsrTimeout { partition: u32, request_id: u64 },
    AlterIsrBackoff { partition: u32, request_id: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientTimer {
    Step,
    Timeout { request_id: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    Broker(BrokerId, u64, BrokerTimer),
    Client(u32, ClientTimer),
    ControllerTick,
}

/// What a node asks of the world.
#[derive(Clone, Debug)]
pub enum Action {
    Send { to: Node, msg: Msg },
    After { delay_ms: u64, timer: Timer },
}

/// Facts a node reports for the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// A leader appended produced records at `leader_epoch`.
    LeaderAppend {
        partition: u32,
        broker: BrokerId,
        incarnation: u64,
        leader_epoch: LeaderEpoch,
    },
    /// A producer got a successful answer: `values` are at `base..`.
    Acked {
        partition: u32,
        acks: i16,
        base: i64,
        values: Vec<u64>,
    },
    /// A leader said a consumer's next offset is past its log end.
    OutOfRange { partition: u32, offset: i64 },
    /// A consumer read `records` at `offset..`.
    Consumed {
        partition: u32,
        offset: i64,
        records: Vec<Rec>,
    },
}
