//! Evaluating an SQL92 filter's tree against a message's properties and
//! tag, three-valued (TRUE, FALSE, NULL) as RocketMQ does.

use std::cmp::Ordering;

use super::tree::Node;
use super::value::{Value, java_compare, java_double_cmp, parse_double};

pub(super) fn eval<'v>(node: &'v Node, lookup: &dyn Fn(&str) -> Option<&'v str>) -> Result<Value<'v>, String> {
    use Value::{Bool, Double, Int, Long, Null, Str};
    Ok(match node {
        Node::Literal(l) => l.value(),
        Node::Property(name) => lookup(name).map_or(Null, Str),
        Node::Negate(x) => match eval(x, lookup)? {
            Int(i) => Int(i.wrapping_neg()),
            Long(l) => Long(l.wrapping_neg()),
            Double(d) => Double(-d),
            _ => Null,
        },
        Node::BoolCast(name) => match lookup(name) {
            Some(_) => Bool(false),
            None => Null,
        },
        Node::Not(x) => match eval(x, lookup)? {
            Bool(b) => Bool(!b),
            Null => Null,
            other => return Err(format!("NOT of {other}")),
        },
        Node::And(operands) => logic(operands, false, lookup)?,
        Node::Or(operands) => logic(operands, true, lookup)?,
        Node::Equal(l, r) => match (eval(l, lookup)?, eval(r, lookup)?) {
            (Null, Null) => Bool(true),
            (Null, _) => Null,
            (_, Null) => Bool(false),
            (a, b) => Bool(java_compare(a, b)? == Ordering::Equal),
        },
        Node::Compare(op, l, r) => {
            let a = eval(l, lookup)?;
            if let Null = a {
                return Ok(Null);
            }
            let b = eval(r, lookup)?;
            let ord = match (a, b) {
                (_, Null) => return Ok(Null),
                // Two strings are compared as doubles or not at all.
                (Str(x), Str(y)) => java_double_cmp(parse_double(x)?, parse_double(y)?),
                (a, b) => java_compare(a, b)?,
            };
            Bool(op.holds(ord))
        }
        Node::In {
            property,
            values,
            negated,
        } => match lookup(property) {
            Some(v) => Bool(values.contains(v) != *negated),
            None => Null,
        },
    })
}

/// AND (`stop` = FALSE) or OR (`stop` = TRUE) over operands left to right:
/// the first `stop` value decides; otherwise NULL if any operand was NULL.
fn logic<'v>(operands: &'v [Node], stop: bool, lookup: &dyn Fn(&str) -> Option<&'v str>) -> Result<Value<'v>, String> {
    let mut unknown = false;
    for operand in operands {
        match eval(operand, lookup)? {
            Value::Bool(b) if b == stop => return Ok(Value::Bool(stop)),
            Value::Bool(_) => {}
            Value::Null => unknown = true,
            other => return Err(format!("{other} is not a condition")),
        }
    }
    Ok(if unknown { Value::Null } else { Value::Bool(!stop) })
}
