//! Check 8, `membership`: after healing, the group is the one intended.
//! Every node the harness runs answers, and names exactly those nodes as
//! voters and no learners (`membership-wrong`; `membership-unread` when a
//! node did not answer). The membership nemesis removes and adds nodes
//! back; a change that was lost, or half-made, shows here.

use super::facts::Sink;
use super::report::CheckResult;
use crate::observations::MemberView;

pub(super) fn membership(members: &[MemberView]) -> CheckResult {
    let mut sink = Sink::new(&[]);
    let intended: Vec<u64> = {
        let mut ids: Vec<u64> = members.iter().map(|m| m.node).collect();
        ids.sort_unstable();
        ids
    };
    for m in members {
        match &m.voters {
            None => sink.add("membership-unread", || {
                (format!("node {} did not say which members it has", m.node), Vec::new())
            }),
            Some(voters) if *voters != intended || !m.learners.is_empty() => sink.add("membership-wrong", || {
                (
                    format!(
                        "node {} names voters {voters:?} and learners {:?}; intended: voters {intended:?}",
                        m.node, m.learners
                    ),
                    Vec::new(),
                )
            }),
            Some(_) => {}
        }
    }
    let description = if members.is_empty() {
        "no node's members were read (a run from before the check)".to_string()
    } else {
        format!(
            "after healing, every node names voters {intended:?} and no learners ({} nodes read)",
            members.len()
        )
    };
    let mut r = sink.finish("membership", description);
    r.judged = !members.is_empty();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: u64, voters: Option<&[u64]>, learners: &[u64]) -> MemberView {
        MemberView {
            node,
            voters: voters.map(<[u64]>::to_vec),
            learners: learners.to_vec(),
        }
    }

    #[test]
    fn the_intended_group_passes_and_every_other_fails() {
        let all: &[u64] = &[1, 2, 3];
        let good = [
            view(1, Some(all), &[]),
            view(2, Some(all), &[]),
            view(3, Some(all), &[]),
        ];
        let r = membership(&good);
        assert!(r.judged && r.passed, "{r:?}");

        let left_out = [
            view(1, Some(&[1, 2]), &[3]),
            view(2, Some(all), &[]),
            view(3, None, &[]),
        ];
        let r = membership(&left_out);
        assert!(!r.passed);
        assert_eq!(r.counts.get("membership-wrong"), Some(&1));
        assert_eq!(r.counts.get("membership-unread"), Some(&1));

        let r = membership(&[]);
        assert!(!r.judged && r.passed);
    }
}
