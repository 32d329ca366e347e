//! Target assignments: which member of a group should own which partition,
//! as a pure function of the members' subscriptions, the topics' partition
//! counts and (for the sticky assignor) the previous target.

use std::collections::{BTreeMap, BTreeSet};

use super::records::AssignorKind;
use super::TopicPartition;

pub type Assignment = BTreeMap<String, BTreeSet<TopicPartition>>;

/// Computes a target. Every member gets an entry (perhaps empty); a partition
/// goes to at most one member, and only to one subscribed to its topic.
pub fn assign(
    kind: AssignorKind,
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    partition_counts: &BTreeMap<String, u32>,
    previous: &Assignment,
) -> Assignment {
    let target = match kind {
        AssignorKind::Sticky => sticky(subscriptions, partition_counts, previous),
        AssignorKind::Range => range(subscriptions, partition_counts),
    };
    check_target(&target, subscriptions, partition_counts);
    target
}

/// Keeps each partition where it was when its owner still subscribes, gives
/// the rest to the least loaded subscribers, then moves partitions one at a
/// time from the most to the least loaded member that can take them until no
/// two members that could trade differ by more than one.
fn sticky(
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    partition_counts: &BTreeMap<String, u32>,
    previous: &Assignment,
) -> Assignment {
    let mut target: Assignment = subscriptions
        .keys()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    let mut taken: BTreeSet<TopicPartition> = BTreeSet::new();
    for (member, partitions) in previous {
        let Some(subscribed) = subscriptions.get(member) else {
            continue;
        };
        for tp in partitions {
            let exists = partition_counts
                .get(&tp.topic)
                .is_some_and(|n| tp.partition.0 < *n);
            if exists && subscribed.contains(&tp.topic) && taken.insert(tp.clone()) {
                target
                    .get_mut(member)
                    .expect("every member has an entry")
                    .insert(tp.clone());
            }
        }
    }
    for (topic, count) in partition_counts {
        let eligible: Vec<&String> = subscriptions
            .iter()
            .filter(|(_, topics)| topics.contains(topic))
            .map(|(m, _)| m)
            .collect();
        if eligible.is_empty() {
            continue;
        }
        for index in 0..*count {
            let tp = TopicPartition::new(topic.clone(), index);
            if taken.contains(&tp) {
                continue;
            }
            let least = eligible
                .iter()
                .min_by_key(|m| (target[m.as_str()].len(), m.as_str()))
                .expect("eligible is not empty");
            target
                .get_mut(least.as_str())
                .expect("member")
                .insert(tp.clone());
            taken.insert(tp);
        }
    }
    // Each move lowers the sum of squared loads, so this ends.
    loop {
        let mut best: Option<(String, String, TopicPartition)> = None;
        let mut donors: Vec<(&String, usize)> = target.iter().map(|(m, p)| (m, p.len())).collect();
        donors.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        'donors: for (donor, load) in &donors {
            for tp in target[donor.as_str()].iter().rev() {
                let receiver = subscriptions
                    .iter()
                    .filter(|(m, topics)| *m != *donor && topics.contains(&tp.topic))
                    .map(|(m, _)| m)
                    .min_by_key(|m| (target[m.as_str()].len(), m.as_str()));
                if let Some(receiver) = receiver {
                    if target[receiver.as_str()].len() + 2 <= *load {
                        best = Some(((*donor).clone(), receiver.clone(), tp.clone()));
                        break 'donors;
                    }
                }
            }
        }
        let Some((donor, receiver, tp)) = best else {
            break;
        };
        target.get_mut(&donor).expect("donor").remove(&tp);
        target.get_mut(&receiver).expect("receiver").insert(tp);
    }
    target
}

/// Per topic, the subscribers in member id order take contiguous ranges; the
/// first `count % members` take one more.
fn range(
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    partition_counts: &BTreeMap<String, u32>,
) -> Assignment {
    let mut target: Assignment = subscriptions
        .keys()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (topic, count) in partition_counts {
        let eligible: Vec<&String> = subscriptions
            .iter()
            .filter(|(_, topics)| topics.contains(topic))
            .map(|(m, _)| m)
            .collect();
        if eligible.is_empty() {
            continue;
        }
        let members = u32::try_from(eligible.len()).expect("members bounded");
        let (base, extra) = (count / members, count % members);
        let mut next = 0;
        for (i, member) in eligible.iter().enumerate() {
            let i = u32::try_from(i).expect("members bounded");
            let take = base + u32::from(i < extra);
            let set = target.get_mut(member.as_str()).expect("member");
            for index in next..next + take {
                set.insert(TopicPartition::new(topic.clone(), index));
            }
            next += take;
        }
    }
    target
}

fn check_target(
    target: &Assignment,
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    counts: &BTreeMap<String, u32>,
) {
    let mut seen = BTreeSet::new();
    for (member, partitions) in target {
        let subscribed = &subscriptions[member];
        for tp in partitions {
            assert!(
                subscribed.contains(&tp.topic),
                "{tp} given to {member}, which does not subscribe to it"
            );
            assert!(
                counts.get(&tp.topic).is_some_and(|n| tp.partition.0 < *n),
                "{tp} does not exist"
            );
            assert!(seen.insert(tp), "{tp} assigned twice");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn subs(members: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        members
            .iter()
            .map(|(m, topics)| {
                (
                    m.to_string(),
                    topics.iter().map(|t| t.to_string()).collect(),
                )
            })
            .collect()
    }

    fn counts(topics: &[(&str, u32)]) -> BTreeMap<String, u32> {
        topics.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    fn loads(a: &Assignment) -> Vec<usize> {
        a.values().map(BTreeSet::len).collect()
    }

    #[test]
    fn sticky_splits_evenly_and_moves_only_what_must_move() {
        let topics = counts(&[("t", 12)]);
        let three = subs(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"])]);
        let first = assign(AssignorKind::Sticky, &three, &topics, &Assignment::new());
        assert_eq!(loads(&first), vec![4, 4, 4]);

        let four = subs(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"]), ("d", &["t"])]);
        let second = assign(AssignorKind::Sticky, &four, &topics, &first);
        assert_eq!(loads(&second), vec![3, 3, 3, 3]);
        // Exactly three partitions move (one from each old member to d); the
        // rest stay with their owner.
        for m in ["a", "b", "c"] {
            assert!(second[m].is_subset(&first[m]), "{m} gained a partition");
        }
        assert_eq!(second["d"].len(), 3);

        let back = assign(AssignorKind::Sticky, &three, &topics, &second);
        assert_eq!(loads(&back), vec![4, 4, 4]);
        for m in ["a", "b", "c"] {
            assert!(
                second[m].is_subset(&back[m]),
                "{m} lost a partition when d left"
            );
        }
    }

    #[test]
    fn range_gives_contiguous_ranges() {
        let topics = counts(&[("t", 5)]);
        let s = subs(&[("a", &["t"]), ("b", &["t"])]);
        let a = assign(AssignorKind::Range, &s, &topics, &Assignment::new());
        let ids = |m: &str| a[m].iter().map(|tp| tp.partition.0).collect::<Vec<_>>();
        assert_eq!(ids("a"), vec![0, 1, 2]);
        assert_eq!(ids("b"), vec![3, 4]);
    }

    #[test]
    fn unknown_topics_and_unsubscribed_members_get_nothing() {
        let topics = counts(&[("t", 2)]);
        let s = subs(&[("a", &["t"]), ("b", &["missing"])]);
        let a = assign(AssignorKind::Sticky, &s, &topics, &Assignment::new());
        assert_eq!(a["a"].len(), 2);
        assert!(a["b"].is_empty());
    }

    proptest! {
        /// Any subscriptions and previous target: every partition of a
        /// subscribed topic is assigned exactly once, to a subscriber (the
        /// `debug_check` inside `assign`), and members with identical
        /// subscriptions differ by at most one partition.
        #[test]
        fn sticky_is_complete_and_balanced(
            members in proptest::collection::btree_map("[a-f]", proptest::collection::btree_set(0..3u8, 0..3), 1..6),
            partitions in proptest::collection::vec(0..9u32, 3),
            previous_seed in proptest::collection::vec((0..6usize, 0..3u8, 0..9u32), 0..20),
        ) {
            let subscriptions: BTreeMap<String, BTreeSet<String>> = members
                .iter()
                .map(|(m, ts)| (m.clone(), ts.iter().map(|t| format!("t{t}")).collect()))
                .collect();
            let topic_counts: BTreeMap<String, u32> =
                partitions.iter().enumerate().map(|(t, n)| (format!("t{t}"), *n)).collect();
            let names: Vec<&String> = subscriptions.keys().collect();
            let mut previous = Assignment::new();
            for (m, t, p) in previous_seed {
                let member = names[m % names.len()].clone();
                previous.entry(member).or_default().insert(TopicPartition::new(format!("t{t}"), p));
            }
            let target = assign(AssignorKind::Sticky, &subscriptions, &topic_counts, &previous);
            let assigned: usize = target.values().map(BTreeSet::len).sum();
            let expected: u32 = topic_counts
                .iter()
                .filter(|(t, _)| subscriptions.values().any(|s| s.contains(*t)))
                .map(|(_, n)| *n)
                .sum();
            prop_assert_eq!(assigned, expected as usize);
            for (a, sa) in &subscriptions {
                for (b, sb) in &subscriptions {
                    if sa == sb && !sa.is_empty() {
                        prop_assert!(target[a].len() <= target[b].len() + 1, "{a} vs {b}: {target:?}");
                    }
                }
            }
        }
    }
}
