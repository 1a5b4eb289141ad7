//! Check 9, `access`: no call was refused for want of credentials or a
//! policy (`unauthorized`: the v2 `UNAUTHORIZED` code, or gRPC's
//! `UNAUTHENTICATED` or `PERMISSION_DENIED`). With `--secure` the workload
//! runs as a user whose policy allows everything it does; users and
//! policies are the group's replicated state, so every node must know
//! them through every fault: a node that has not caught up yet must wait
//! or say it is unavailable, never refuse. Without `--secure` nothing is
//! ever refused this way, and the check passes trivially.

use super::facts::Sink;
use super::report::CheckResult;
use crate::history::{Op, OpType};

pub(super) fn access(ops: &[Op]) -> CheckResult {
    let mut sink = Sink::new(ops);
    for (i, op) in ops.iter().enumerate() {
        if !matches!(op.kind, OpType::Fail | OpType::Info) {
            continue;
        }
        if let Some(e) = &op.error
            && crate::client::is_access_refusal(e)
        {
            sink.add("unauthorized", || {
                let node = op.node.map_or(String::new(), |n| format!(" by node {n}"));
                (format!("{} refused{node}: {e}", op.f()), vec![i])
            });
        }
    }
    sink.finish(
        "access",
        "no call was refused for want of credentials or a policy (--secure: the workload's user and \
         policy hold on every node through every fault)"
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::check;
    use crate::checker::report::Inputs;
    use crate::checker::test_support::H;

    /// A send that failed with `error`.
    fn failed_send(h: &mut H, p: u64, value: u64, error: &str) {
        let (_, c) = h.send(p, "k", value, OpType::Fail, None);
        h.ops[c as usize].error = Some(error.into());
    }

    #[test]
    fn a_refused_call_is_an_anomaly_and_other_failures_are_not() {
        let mut h = H::default();
        failed_send(
            &mut h,
            1,
            2,
            "50002: cannot check credentials here yet: this node knows no leader",
        );
        assert!(access(&h.ops).passed, "unavailable is not a refusal");
        failed_send(&mut h, 0, 1, "40100: unauthenticated: no user jepsen");
        let r = access(&h.ops);
        assert!(!r.passed);
        assert_eq!(r.counts.get("unauthorized"), Some(&1));
        assert_eq!(r.anomalies[0].ops, [3]);
        let r = check(&Inputs {
            ops: &h.ops,
            ..Default::default()
        });
        assert!(!r.valid, "the access check is judged");
    }
}
