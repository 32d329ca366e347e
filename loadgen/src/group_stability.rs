//! Whether a consumer group is ready for a run to start producing, from
//! what each member reports. Plain data, no I/O.
//!
//! Members start at the log end (`offset_reset` latest), so a partition no
//! member has positioned when producers start could lose the first records
//! to a later `latest`. A group is stable when every member has joined,
//! the members own every partition of the topic exactly once, the split is
//! balanced (each owns the floor or the ceiling of partitions / members, so
//! the assignor has nothing left to move), and every member has positioned
//! and committed what it owns.

use std::collections::BTreeSet;

/// What one member reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberView {
    /// The coordinator counted it in (member epoch above 0).
    pub joined: bool,
    /// The partitions of the run's topic it owns.
    pub owned: Vec<u32>,
    /// Every owned partition is positioned at the log end and committed.
    pub positioned: bool,
}

/// A group's readiness, with the counts that explain a "not yet".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stability {
    pub members: u32,
    pub members_joined: u32,
    pub members_positioned: u32,
    pub partitions: u32,
    /// Distinct partitions of the topic some member owns.
    pub partitions_owned: u32,
    /// Some partition is owned by two members (a move in progress).
    pub overlapping: bool,
    /// Every member owns floor(partitions / members) or one more.
    pub balanced: bool,
}

impl Stability {
    pub fn of(partitions: u32, members: &[MemberView]) -> Stability {
        let mut owned: BTreeSet<u32> = BTreeSet::new();
        let mut overlapping = false;
        for member in members {
            for &partition in &member.owned {
                overlapping |= !owned.insert(partition);
            }
        }
        let count = members.len() as u32;
        let (floor, ceiling) = match count {
            0 => (0, 0),
            _ => (partitions / count, partitions.div_ceil(count)),
        };
        let balanced = members.iter().all(|m| {
            let owns = m.owned.len() as u32;
            floor <= owns && owns <= ceiling
        });
        Stability {
            members: count,
            members_joined: members.iter().filter(|m| m.joined).count() as u32,
            members_positioned: members.iter().filter(|m| m.positioned).count() as u32,
            partitions,
            partitions_owned: owned.range(..partitions).count() as u32,
            overlapping,
            balanced,
        }
    }

    pub fn is_stable(&self) -> bool {
        self.members > 0
            && self.members_joined == self.members
            && self.members_positioned == self.members
            && self.partitions_owned == self.partitions
            && !self.overlapping
            && self.balanced
    }
}

impl std::fmt::Display for Stability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} members joined, {} of {} partitions owned, {} of {} members positioned{}{}",
            self.members_joined,
            self.members,
            self.partitions_owned,
            self.partitions,
            self.members_positioned,
            self.members,
            if self.overlapping {
                ", a partition owned twice"
            } else {
                ""
            },
            if self.balanced { "" } else { ", unbalanced" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(owned: &[u32]) -> MemberView {
        MemberView {
            joined: true,
            owned: owned.to_vec(),
            positioned: true,
        }
    }

    // A balanced, disjoint, complete and positioned split is stable; each
    // missing piece on its own makes it unstable.
    #[test]
    fn stable_only_when_complete_balanced_and_positioned() {
        let stable = [member(&[0, 2, 4]), member(&[1, 3])];
        assert!(Stability::of(5, &stable).is_stable());

        let first_alone = [member(&[0, 1, 2, 3, 4]), member(&[])];
        let stability = Stability::of(5, &first_alone);
        assert!(!stability.balanced && !stability.is_stable());
        assert!(stability.to_string().contains("unbalanced"));

        let missing = [member(&[0, 2]), member(&[1, 3])];
        assert_eq!(Stability::of(5, &missing).partitions_owned, 4);
        assert!(!Stability::of(5, &missing).is_stable());

        let twice = [member(&[0, 1, 2]), member(&[2, 3, 4])];
        assert!(Stability::of(5, &twice).overlapping);
        assert!(!Stability::of(5, &twice).is_stable());

        let mut joining = stable.clone();
        joining[1].joined = false;
        assert!(!Stability::of(5, &joining).is_stable());

        let mut unpositioned = stable.clone();
        unpositioned[0].positioned = false;
        let stability = Stability::of(5, &unpositioned);
        assert!(!stability.is_stable());
        assert_eq!(
            stability.to_string(),
            "2 of 2 members joined, 5 of 5 partitions owned, 1 of 2 members positioned"
        );
    }

    // More members than partitions: some own nothing, which is balanced.
    #[test]
    fn idle_members_are_balanced() {
        let members = [member(&[0]), member(&[1]), member(&[])];
        assert!(Stability::of(2, &members).is_stable());
        assert!(!Stability::of(2, &[]).is_stable(), "no member, no group");
    }
}
