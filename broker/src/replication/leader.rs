//! A partition leader's view of its followers: how far each has fetched,
//! when each was last caught up, the high watermark that follows from the
//! ISR, and which ISR change to ask the controller for. Pure: time comes in
//! as milliseconds, nothing here does I/O.

use std::collections::BTreeMap;

/// One follower as its fetches show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Progress {
    /// Every offset below this is on the follower. `None` until it fetches
    /// from this leadership.
    log_end: Option<i64>,
    /// The leader's log end when this follower last fetched.
    leader_end_at_last_fetch: i64,
    /// Last time the follower had everything the leader had at its previous
    /// fetch.
    caught_up_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderState {
    me: u32,
    followers: BTreeMap<u32, Progress>,
    high_watermark: i64,
}

impl LeaderState {
    /// A new leadership over `replicas` (this broker included), starting with
    /// the high watermark this replica knew. Every follower counts as caught
    /// up now, so none is dropped from the ISR before it could fetch.
    pub fn new(me: u32, replicas: &[u32], high_watermark: i64, now_ms: u64) -> LeaderState {
        let followers = replicas
            .iter()
            .filter(|&&r| r != me)
            .map(|&r| {
                (
                    r,
                    Progress {
                        log_end: None,
                        leader_end_at_last_fetch: 0,
                        caught_up_ms: now_ms,
                    },
                )
            })
            .collect();
        LeaderState {
            me,
            followers,
            high_watermark,
        }
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    pub fn follower_log_end(&self, follower: u32) -> Option<i64> {
        self.followers.get(&follower).and_then(|p| p.log_end)
    }

    /// A fetch by `follower` at `fetch_offset` while the leader's log ends at
    /// `leader_end`. Returns false for a broker that is not a follower.
    pub fn on_fetch(
        &mut self,
        follower: u32,
        fetch_offset: i64,
        leader_end: i64,
        now_ms: u64,
    ) -> bool {
        let Some(progress) = self.followers.get_mut(&follower) else {
            return false;
        };
        if fetch_offset >= leader_end || fetch_offset >= progress.leader_end_at_last_fetch {
            progress.caught_up_ms = now_ms;
        }
        progress.log_end = Some(fetch_offset.min(leader_end));
        progress.leader_end_at_last_fetch = leader_end;
        true
    }

    /// Moves the high watermark to the smallest log end among the ISR (the
    /// leader's own included), never backwards. Returns the new value.
    pub fn update_high_watermark(&mut self, isr: &[u32], leader_end: i64) -> i64 {
        let mut low = leader_end;
        for member in isr.iter().filter(|&&m| m != self.me) {
            match self.followers.get(member).and_then(|p| p.log_end) {
                Some(end) => low = low.min(end),
                // A member that has not fetched yet holds the watermark.
                None => low = low.min(self.high_watermark),
            }
        }
        self.high_watermark = self.high_watermark.max(low).min(leader_end);
        self.high_watermark
    }

    /// The ISR to ask for, if it should change: members that have not caught
    /// up within `lag_max_ms` leave; followers that reached the high
    /// watermark (and the start of this leadership's epoch) join.
    pub fn desired_isr(
        &self,
        isr: &[u32],
        epoch_start: i64,
        now_ms: u64,
        lag_max_ms: u64,
    ) -> Option<Vec<u32>> {
        let mut next: Vec<u32> = isr
            .iter()
            .copied()
            .filter(|&m| {
                m == self.me
                    || self
                        .followers
                        .get(&m)
                        .is_some_and(|p| now_ms.saturating_sub(p.caught_up_ms) <= lag_max_ms)
            })
            .collect();
        for (&follower, progress) in &self.followers {
            let caught_up = now_ms.saturating_sub(progress.caught_up_ms) <= lag_max_ms
                && progress
                    .log_end
                    .is_some_and(|end| end >= self.high_watermark && end >= epoch_start);
            if caught_up && !next.contains(&follower) {
                next.push(follower);
            }
        }
        next.sort_unstable();
        let mut current = isr.to_vec();
        current.sort_unstable();
        (next != current).then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_watermark_is_the_isr_minimum_and_never_moves_back() {
        let mut leader = LeaderState::new(1, &[1, 2, 3], 0, 0);
        let isr = [1, 2, 3];
        // Followers have not fetched: nothing is committed past the start.
        assert_eq!(leader.update_high_watermark(&isr, 10), 0);
        leader.on_fetch(2, 10, 10, 5);
        assert_eq!(leader.update_high_watermark(&isr, 10), 0, "3 holds it");
        leader.on_fetch(3, 7, 10, 5);
        assert_eq!(leader.update_high_watermark(&isr, 10), 7);
        // Without 3 in the ISR the watermark follows 2 and the leader.
        assert_eq!(leader.update_high_watermark(&[1, 2], 10), 10);
        // Adding 3 back does not move it backwards.
        assert_eq!(leader.update_high_watermark(&isr, 12), 10);
        // Alone, the leader's log end is the watermark.
        assert_eq!(leader.update_high_watermark(&[1], 15), 15);
        // A fetch by a non-replica is not counted.
        assert!(!leader.on_fetch(9, 100, 15, 6));
    }

    #[test]
    fn isr_shrinks_on_lag_and_grows_on_catch_up() {
        let lag_max_ms = 1_000;
        let mut leader = LeaderState::new(1, &[1, 2, 3], 0, 0);
        let isr = vec![1, 2, 3];
        leader.on_fetch(2, 0, 0, 100);
        leader.on_fetch(3, 0, 0, 100);
        assert_eq!(leader.desired_isr(&isr, 0, 900, lag_max_ms), None);
        // 2 keeps fetching and keeps up while the leader appends; 3 stops.
        for t in 1..20u64 {
            let leader_end = (t * 10) as i64;
            leader.on_fetch(2, leader_end - 10, leader_end, 100 + t * 100);
        }
        assert_eq!(
            leader.desired_isr(&isr, 0, 2_000, lag_max_ms),
            Some(vec![1, 2]),
            "3 lagged past the bound; 2 never did although never at the very end"
        );
        let isr = vec![1, 2];
        leader.update_high_watermark(&isr, 190);
        // 3 returns but is behind the high watermark: not yet.
        leader.on_fetch(3, 50, 190, 2_100);
        assert_eq!(leader.desired_isr(&isr, 0, 2_100, lag_max_ms), None);
        leader.on_fetch(3, 190, 190, 2_200);
        assert_eq!(
            leader.desired_isr(&isr, 0, 2_200, lag_max_ms),
            Some(vec![1, 2, 3])
        );
        // Not before it reached the start of this leader's epoch.
        assert_eq!(leader.desired_isr(&isr, 500, 2_200, lag_max_ms), None);
    }
}
