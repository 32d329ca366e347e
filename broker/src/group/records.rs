//! The records a group coordinator writes to `__consumer_offsets`: their
//! typed form and their byte layout (docs/formats/consumer-offsets.md). Every
//! kind has its own key, so compaction keeps the latest of each; a null value
//! is a tombstone that deletes what the key named.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

use super::{GroupEpoch, MemberEpoch, PartitionIndex, TopicPartition};

/// Longest key or value the decoder accepts before looking further.
pub const RECORD_BYTES_MAX: usize = 4 << 20;
/// Partitions named in one assignment inside a record.
pub const ASSIGNMENT_PARTITIONS_MAX: usize = 1_000_000;

const KEY_OFFSET: u16 = 1;
const KEY_GROUP: u16 = 2;
const KEY_MEMBER: u16 = 3;
const KEY_TARGET: u16 = 4;
const KEY_CURRENT: u16 = 5;
const VALUE_VERSION: u16 = 0;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("group record is malformed: {0}")]
    Malformed(&'static str),
    #[error("group record key type {0} is unknown")]
    UnknownKey(u16),
    #[error("group record value version {0} is unknown")]
    UnknownVersion(u16),
}

/// Which assignor computes a group's target assignment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum AssignorKind {
    /// Balances partitions and moves as few as possible.
    #[default]
    Sticky,
    /// Kafka's range assignor: per topic, contiguous ranges in member order.
    Range,
}

impl AssignorKind {
    pub fn name(self) -> &'static str {
        match self {
            AssignorKind::Sticky => "sticky",
            AssignorKind::Range => "range",
        }
    }

    pub fn from_name(name: &str) -> Option<AssignorKind> {
        match name {
            "sticky" | "uniform" => Some(AssignorKind::Sticky),
            "range" => Some(AssignorKind::Range),
            _ => None,
        }
    }

    fn code(self) -> u8 {
        match self {
            AssignorKind::Sticky => 0,
            AssignorKind::Range => 1,
        }
    }

    fn from_code(code: u8) -> Result<AssignorKind, RecordError> {
        match code {
            0 => Ok(AssignorKind::Sticky),
            1 => Ok(AssignorKind::Range),
            _ => Err(RecordError::Malformed("unknown assignor")),
        }
    }
}

/// A committed offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub metadata: String,
    /// Wall-clock time of the commit, for expiry.
    pub commit_time_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupValue {
    pub epoch: GroupEpoch,
    pub assignor: AssignorKind,
    /// Wall-clock time the group last lost its last member (-1 while it has
    /// members): offsets expire counted from the later of this and the last
    /// commit.
    pub empty_since_ms: i64,
}

/// What a member told the coordinator about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberValue {
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed: BTreeSet<String>,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
}

/// The group's target assignment, computed at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetValue {
    pub epoch: GroupEpoch,
    pub members: BTreeMap<String, BTreeSet<TopicPartition>>,
}

/// Where a member is in reconciling towards the target assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Owns exactly its target.
    Stable,
    /// Was told to give up `pending_revocation` and has not confirmed yet;
    /// its epoch stays until it does.
    UnrevokedPartitions,
    /// Has reconciled to the target epoch but waits for partitions that other
    /// members still hold.
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }

    fn code(self) -> u8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        }
    }

    fn from_code(code: u8) -> Result<MemberState, RecordError> {
        match code {
            0 => Ok(MemberState::Stable),
            1 => Ok(MemberState::UnrevokedPartitions),
            2 => Ok(MemberState::UnreleasedPartitions),
            _ => Err(RecordError::Malformed("unknown member state")),
        }
    }
}

/// What a member currently owns as far as the coordinator is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentValue {
    pub member_epoch: MemberEpoch,
    pub previous_member_epoch: MemberEpoch,
    pub state: MemberState,
    pub assigned: BTreeSet<TopicPartition>,
    /// Partitions the member was asked to give up; still its own until it
    /// confirms, so nobody else gets them meanwhile.
    pub pending_revocation: BTreeSet<TopicPartition>,
}

/// One record of `__consumer_offsets`; `None` values are tombstones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupRecord {
    Offset {
        group: String,
        partition: TopicPartition,
        value: Option<OffsetValue>,
    },
    Group {
        group: String,
        value: Option<GroupValue>,
    },
    Member {
        group: String,
        member_id: String,
        value: Option<MemberValue>,
    },
    Target {
        group: String,
        value: Option<TargetValue>,
    },
    Current {
        group: String,
        member_id: String,
        value: Option<CurrentValue>,
    },
}

impl GroupRecord {
    pub fn group(&self) -> &str {
        match self {
            GroupRecord::Offset { group, .. }
            | GroupRecord::Group { group, .. }
            | GroupRecord::Member { group, .. }
            | GroupRecord::Target { group, .. }
            | GroupRecord::Current { group, .. } => group,
        }
    }

    pub fn encode_key(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(64);
        match self {
            GroupRecord::Offset {
                group, partition, ..
            } => {
                out.put_u16(KEY_OFFSET);
                put_str(&mut out, group);
                put_str(&mut out, &partition.topic);
                out.put_u32(partition.partition.0);
            }
            GroupRecord::Group { group, .. } => {
                out.put_u16(KEY_GROUP);
                put_str(&mut out, group);
            }
            GroupRecord::Member {
                group, member_id, ..
            } => {
                out.put_u16(KEY_MEMBER);
                put_str(&mut out, group);
                put_str(&mut out, member_id);
            }
            GroupRecord::Target { group, .. } => {
                out.put_u16(KEY_TARGET);
                put_str(&mut out, group);
            }
            GroupRecord::Current {
                group, member_id, ..
            } => {
                out.put_u16(KEY_CURRENT);
                put_str(&mut out, group);
                put_str(&mut out, member_id);
            }
        }
        out.freeze()
    }

    /// The value bytes, or `None` for a tombstone.
    pub fn encode_value(&self) -> Option<Bytes> {
        let mut out = BytesMut::with_capacity(64);
        out.put_u16(VALUE_VERSION);
        match self {
            GroupRecord::Offset { value, .. } => {
                let v = value.as_ref()?;
                out.put_i64(v.offset);
                put_str(&mut out, &v.metadata);
                out.put_i64(v.commit_time_ms);
            }
            GroupRecord::Group { value, .. } => {
                let v = value.as_ref()?;
                out.put_i32(v.epoch.0);
                out.put_u8(v.assignor.code());
                out.put_i64(v.empty_since_ms);
            }
            GroupRecord::Member { value, .. } => {
                let v = value.as_ref()?;
                match &v.instance_id {
                    Some(id) => {
                        out.put_u8(1);
                        put_str(&mut out, id);
                    }
                    None => out.put_u8(0),
                }
                put_str(&mut out, &v.client_id);
                put_str(&mut out, &v.client_host);
                out.put_u32(len_u32(v.subscribed.len()));
                for topic in &v.subscribed {
                    put_str(&mut out, topic);
                }
                out.put_u32(v.session_timeout_ms);
                out.put_u32(v.rebalance_timeout_ms);
            }
            GroupRecord::Target { value, .. } => {
                let v = value.as_ref()?;
                out.put_i32(v.epoch.0);
                out.put_u32(len_u32(v.members.len()));
                for (member, partitions) in &v.members {
                    put_str(&mut out, member);
                    put_partitions(&mut out, partitions);
                }
            }
            GroupRecord::Current { value, .. } => {
                let v = value.as_ref()?;
                out.put_i32(v.member_epoch.0);
                out.put_i32(v.previous_member_epoch.0);
                out.put_u8(v.state.code());
                put_partitions(&mut out, &v.assigned);
                put_partitions(&mut out, &v.pending_revocation);
            }
        }
        Some(out.freeze())
    }

    /// Decodes one stored record; anything malformed is an error, never a panic.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<GroupRecord, RecordError> {
        if key.len() > RECORD_BYTES_MAX || value.is_some_and(|v| v.len() > RECORD_BYTES_MAX) {
            return Err(RecordError::Malformed("record too large"));
        }
        let mut k = Reader(key);
        let kind = k.u16()?;
        let mut v = match value {
            Some(bytes) => {
                let mut r = Reader(bytes);
                let version = r.u16()?;
                if version != VALUE_VERSION {
                    return Err(RecordError::UnknownVersion(version));
                }
                Some(r)
            }
            None => None,
        };
        let record = match kind {
            KEY_OFFSET => {
                let group = k.string()?;
                let topic = k.string()?;
                let partition = TopicPartition {
                    topic,
                    partition: PartitionIndex(k.u32()?),
                };
                let value = match v.as_mut() {
                    Some(r) => Some(OffsetValue {
                        offset: r.i64()?,
                        metadata: r.string()?,
                        commit_time_ms: r.i64()?,
                    }),
                    None => None,
                };
                GroupRecord::Offset {
                    group,
                    partition,
                    value,
                }
            }
            KEY_GROUP => {
                let group = k.string()?;
                let value = match v.as_mut() {
                    Some(r) => Some(GroupValue {
                        epoch: GroupEpoch(r.i32()?),
                        assignor: AssignorKind::from_code(r.u8()?)?,
                        empty_since_ms: r.i64()?,
                    }),
                    None => None,
                };
                GroupRecord::Group { group, value }
            }
            KEY_MEMBER => {
                let group = k.string()?;
                let member_id = k.string()?;
                let value = match v.as_mut() {
                    Some(r) => {
                        let instance_id = match r.u8()? {
                            0 => None,
                            1 => Some(r.string()?),
                            _ => return Err(RecordError::Malformed("instance id flag")),
                        };
                        let client_id = r.string()?;
                        let client_host = r.string()?;
                        let count = r.count(super::SUBSCRIBED_TOPICS_MAX)?;
                        let mut subscribed = BTreeSet::new();
                        for _ in 0..count {
                            subscribed.insert(r.string()?);
                        }
                        Some(MemberValue {
                            instance_id,
                            client_id,
                            client_host,
                            subscribed,
                            session_timeout_ms: r.u32()?,
                            rebalance_timeout_ms: r.u32()?,
                        })
                    }
                    None => None,
                };
                GroupRecord::Member {
                    group,
                    member_id,
                    value,
                }
            }
            KEY_TARGET => {
                let group = k.string()?;
                let value = match v.as_mut() {
                    Some(r) => {
                        let epoch = GroupEpoch(r.i32()?);
                        let count = r.count(super::MEMBERS_PER_GROUP_MAX)?;
                        let mut members = BTreeMap::new();
                        for _ in 0..count {
                            let member = r.string()?;
                            members.insert(member, r.partitions()?);
                        }
                        Some(TargetValue { epoch, members })
                    }
                    None => None,
                };
                GroupRecord::Target { group, value }
            }
            KEY_CURRENT => {
                let group = k.string()?;
                let member_id = k.string()?;
                let value = match v.as_mut() {
                    Some(r) => Some(CurrentValue {
                        member_epoch: MemberEpoch(r.i32()?),
                        previous_member_epoch: MemberEpoch(r.i32()?),
                        state: MemberState::from_code(r.u8()?)?,
                        assigned: r.partitions()?,
                        pending_revocation: r.partitions()?,
                    }),
                    None => None,
                };
                GroupRecord::Current {
                    group,
                    member_id,
                    value,
                }
            }
            other => return Err(RecordError::UnknownKey(other)),
        };
        if !k.0.is_empty() || v.is_some_and(|r| !r.0.is_empty()) {
            return Err(RecordError::Malformed("trailing bytes"));
        }
        Ok(record)
    }
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("collection bounded far below u32::MAX")
}

fn put_str(out: &mut BytesMut, s: &str) {
    let len = u16::try_from(s.len()).expect("names are bounded below 64 KiB");
    out.put_u16(len);
    out.put_slice(s.as_bytes());
}

/// Partitions grouped by topic, so a topic's name appears once.
fn put_partitions(out: &mut BytesMut, partitions: &BTreeSet<TopicPartition>) {
    let mut by_topic: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for tp in partitions {
        by_topic
            .entry(tp.topic.as_str())
            .or_default()
            .push(tp.partition.0);
    }
    out.put_u32(len_u32(by_topic.len()));
    for (topic, indexes) in by_topic {
        put_str(out, topic);
        out.put_u32(len_u32(indexes.len()));
        for index in indexes {
            out.put_u32(index);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Malformed("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, RecordError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn string(&mut self) -> Result<String, RecordError> {
        let len = usize::from(self.u16()?);
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError::Malformed("name is not UTF-8"))
    }

    /// A count that must fit both its bound and the bytes left (each item
    /// takes at least two bytes), so a forged count cannot make us allocate.
    fn count(&mut self, max: usize) -> Result<usize, RecordError> {
        let count = usize::try_from(self.u32()?).map_err(|_| RecordError::Malformed("count"))?;
        if count > max || count > self.0.len() / 2 {
            return Err(RecordError::Malformed("count out of bounds"));
        }
        Ok(count)
    }

    fn partitions(&mut self) -> Result<BTreeSet<TopicPartition>, RecordError> {
        let topics = self.count(ASSIGNMENT_PARTITIONS_MAX)?;
        let mut out = BTreeSet::new();
        for _ in 0..topics {
            let topic = self.string()?;
            let count = self.count(ASSIGNMENT_PARTITIONS_MAX)?;
            for _ in 0..count {
                out.insert(TopicPartition {
                    topic: topic.clone(),
                    partition: PartitionIndex(self.u32()?),
                });
            }
            if out.len() > ASSIGNMENT_PARTITIONS_MAX {
                return Err(RecordError::Malformed("too many partitions"));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: u32) -> TopicPartition {
        TopicPartition::new(t, p)
    }

    pub(crate) fn samples() -> Vec<GroupRecord> {
        let g = "billing".to_string();
        vec![
            GroupRecord::Offset {
                group: g.clone(),
                partition: tp("orders", 3),
                value: Some(OffsetValue {
                    offset: 42,
                    metadata: "m".into(),
                    commit_time_ms: 7,
                }),
            },
            GroupRecord::Offset {
                group: g.clone(),
                partition: tp("orders", 3),
                value: None,
            },
            GroupRecord::Group {
                group: g.clone(),
                value: Some(GroupValue {
                    epoch: GroupEpoch(3),
                    assignor: AssignorKind::Range,
                    empty_since_ms: 9,
                }),
            },
            GroupRecord::Member {
                group: g.clone(),
                member_id: "m1".into(),
                value: Some(MemberValue {
                    instance_id: Some("i1".into()),
                    client_id: "c".into(),
                    client_host: "127.0.0.1".into(),
                    subscribed: ["orders".to_string(), "x".to_string()].into(),
                    session_timeout_ms: 45_000,
                    rebalance_timeout_ms: 60_000,
                }),
            },
            GroupRecord::Target {
                group: g.clone(),
                value: Some(TargetValue {
                    epoch: GroupEpoch(3),
                    members: [("m1".to_string(), [tp("orders", 0), tp("x", 1)].into())].into(),
                }),
            },
            GroupRecord::Current {
                group: g,
                member_id: "m1".into(),
                value: Some(CurrentValue {
                    member_epoch: MemberEpoch(3),
                    previous_member_epoch: MemberEpoch(2),
                    state: MemberState::UnrevokedPartitions,
                    assigned: [tp("orders", 0)].into(),
                    pending_revocation: [tp("orders", 1)].into(),
                }),
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for record in samples() {
            let key = record.encode_key();
            let value = record.encode_value();
            assert_eq!(GroupRecord::decode(&key, value.as_deref()), Ok(record));
        }
    }

    #[test]
    fn malformed_bytes_are_errors() {
        for record in samples() {
            let key = record.encode_key();
            let Some(value) = record.encode_value() else {
                continue;
            };
            for cut in 0..value.len() {
                assert!(
                    GroupRecord::decode(&key, Some(&value[..cut])).is_err(),
                    "{record:?} cut at {cut}"
                );
            }
            let mut longer = value.to_vec();
            longer.push(0);
            assert_eq!(
                GroupRecord::decode(&key, Some(&longer)),
                Err(RecordError::Malformed("trailing bytes"))
            );
        }
        assert_eq!(
            GroupRecord::decode(&[0, 99, 0, 0], None),
            Err(RecordError::UnknownKey(99))
        );
        assert_eq!(
            GroupRecord::decode(&[0, 2, 0, 0], Some(&[0, 9])),
            Err(RecordError::UnknownVersion(9))
        );
        // A count claiming more items than bytes left is refused before allocating.
        let mut forged = vec![0, 0, 0, 0, 0, 1, 0];
        forged.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(GroupRecord::decode(&[0, 4, 0, 1, b'g'], Some(&forged)).is_err());
    }
}
