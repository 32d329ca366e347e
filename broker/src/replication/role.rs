//! What this broker does for one partition replica, as the controller's
//! metadata says, and the pure rule for moving from one role to the next.
//! Metadata reaches a replica along two paths (the controller's deltas and
//! the answer to this leader's own AlterIsr), so an older role can arrive after
//! a newer one; it is ignored, never applied.

use protocol::{BrokerId, LeaderEpoch, PartitionEpoch};

/// What this broker does for a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    pub leader: bool,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    /// acks=all needs at least this many in-sync replicas (topic config
    /// `min.insync.replicas`, default 1).
    pub min_insync: usize,
    /// For a follower: the leader's shard endpoint to fetch from.
    pub leader_endpoint: Option<String>,
}

impl Role {
    /// The role of a replica just opened, before any metadata applied to it:
    /// older than every role the controller gives out.
    pub fn opened(like: &Role) -> Role {
        Role {
            leader: false,
            leader_epoch: LeaderEpoch(-1),
            partition_epoch: PartitionEpoch(-1),
            ..like.clone()
        }
    }
}

/// What applying a role from the metadata does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    /// The same role again.
    Unchanged,
    /// Older than the role held (a lower leader epoch, or a lower partition
    /// epoch of the same leadership): ignored.
    Stale,
    Apply {
        /// A leadership starts (or a new epoch of it): start the epoch at the
        /// log end and track the followers afresh.
        new_leadership: bool,
        /// Stops leading: pending acks=all writes of the old leadership fail.
        demoted: bool,
    },
}

pub fn role_change(old: &Role, new: &Role) -> RoleChange {
    if old == new {
        return RoleChange::Unchanged;
    }
    let older = new.leader_epoch < old.leader_epoch
        || (new.leader_epoch == old.leader_epoch && new.partition_epoch < old.partition_epoch);
    if older {
        return RoleChange::Stale;
    }
    RoleChange::Apply {
        new_leadership: new.leader && (!old.leader || new.leader_epoch != old.leader_epoch),
        demoted: old.leader && (!new.leader || new.leader_epoch != old.leader_epoch),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A role over replicas 1, 2 and 3 with `min.insync.replicas` 2.
    pub(in crate::replication) fn role(
        leader: bool,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: &[u32],
    ) -> Role {
        Role {
            leader,
            leader_epoch: LeaderEpoch(leader_epoch),
            partition_epoch: PartitionEpoch(partition_epoch),
            replicas: [1, 2, 3].map(BrokerId).to_vec(),
            isr: isr.iter().copied().map(BrokerId).collect(),
            min_insync: 2,
            leader_endpoint: None,
        }
    }

    #[test]
    fn older_roles_are_ignored() {
        let held = role(true, 3, 7, &[1, 2]);
        // The ISR before this leader's own shrink, delivered late by a delta.
        assert_eq!(
            role_change(&held, &role(true, 3, 6, &[1, 2, 3])),
            RoleChange::Stale
        );
        assert_eq!(
            role_change(&held, &role(false, 2, 9, &[1, 2, 3])),
            RoleChange::Stale
        );
        assert_eq!(role_change(&held, &held.clone()), RoleChange::Unchanged);
    }

    #[test]
    fn leadership_starts_and_ends_with_epochs() {
        let follower = role(false, 3, 7, &[1, 2, 3]);
        assert_eq!(
            role_change(&follower, &role(true, 4, 8, &[1, 2])),
            RoleChange::Apply {
                new_leadership: true,
                demoted: false
            }
        );
        let leader = role(true, 4, 8, &[1, 2]);
        assert_eq!(
            role_change(&leader, &role(true, 4, 9, &[1, 2, 3])),
            RoleChange::Apply {
                new_leadership: false,
                demoted: false
            },
            "an ISR change keeps the leadership"
        );
        assert_eq!(
            role_change(&leader, &role(false, 5, 9, &[2, 3])),
            RoleChange::Apply {
                new_leadership: false,
                demoted: true
            }
        );
        assert_eq!(
            role_change(&leader, &role(true, 6, 10, &[1, 3])),
            RoleChange::Apply {
                new_leadership: true,
                demoted: true
            },
            "led again at a newer epoch: the old epoch's waiters fail"
        );
        let opened = Role::opened(&leader);
        assert!(matches!(
            role_change(&opened, &role(false, 0, 0, &[1, 2, 3])),
            RoleChange::Apply { .. }
        ));
    }
}
