//! The expression tree of an SQL92 filter, built from sqlparser's AST with
//! RocketMQ's parse-time checks (types of comparison operands, literal
//! BETWEEN bounds, IN lists of strings), and the limits it is built under.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;

use sqlparser::ast::{BinaryOperator, Expr, InTarget, UnaryOperator, Value as SqlValue};

use super::value::{Value, java_compare};

/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 64;
/// The property name under which an expression reads the message's tag.
pub const TAGS: &str = "TAGS";

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Literal {
    Null,
    Bool(bool),
    /// An integer literal that fits 32 bits: a Java `Integer`.
    Int(i32),
    /// A larger integer literal: a Java `Long`.
    Long(i64),
    Double(f64),
    Str(String),
}

impl Literal {
    pub(super) fn value(&self) -> Value<'_> {
        match self {
            Literal::Null => Value::Null,
            Literal::Bool(b) => Value::Bool(*b),
            Literal::Int(i) => Value::Int(*i),
            Literal::Long(l) => Value::Long(*l),
            Literal::Double(d) => Value::Double(*d),
            Literal::Str(s) => Value::Str(s),
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value().fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum CompareOp {
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub(super) fn holds(self, ord: Ordering) -> bool {
        match self {
            CompareOp::Lt => ord == Ordering::Less,
            CompareOp::Le => ord != Ordering::Greater,
            CompareOp::Gt => ord == Ordering::Greater,
            CompareOp::Ge => ord != Ordering::Less,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
    Literal(Literal),
    Property(String),
    /// Unary minus: a number negated, anything else NULL.
    Negate(Box<Node>),
    /// A property used as a condition: NULL if missing, else FALSE.
    BoolCast(String),
    Not(Box<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
    /// RocketMQ's `=`; also `IS NULL` as `x = NULL` (unchecked).
    Equal(Box<Node>, Box<Node>),
    Compare(CompareOp, Box<Node>, Box<Node>),
    In {
        property: String,
        values: BTreeSet<String>,
        negated: bool,
    },
}

impl Node {
    /// RocketMQ's `BooleanExpression`: what can stand as a condition.
    fn is_boolean(&self) -> bool {
        matches!(
            self,
            Node::Literal(Literal::Bool(_) | Literal::Null)
                | Node::BoolCast(_)
                | Node::Not(_)
                | Node::And(_)
                | Node::Or(_)
                | Node::Equal(..)
                | Node::Compare(..)
                | Node::In { .. }
        )
    }

    fn describe(&self) -> String {
        match self {
            Node::Literal(l) => format!("the literal {l}"),
            Node::Property(name) => format!("the property {name}"),
            Node::Negate(_) => "a negated value".to_owned(),
            _ => "a condition".to_owned(),
        }
    }
}

// The recursion passes through `convert` and one helper per level; both
// keep their frames small (errors are built in separate functions), as
// unoptimized builds give every temporary its own stack slot.
pub(super) fn convert(expr: &Expr, depth: usize) -> Result<Node, String> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    let child = depth + 1;
    match expr {
        // The parser already counted the parentheses.
        Expr::Nested(inner) => convert(inner, depth),
        Expr::Identifier(ident) => Ok(Node::Property(ident.value.clone())),
        Expr::Value(v) => literal(&v.value).map(Node::Literal),
        Expr::UnaryOp { op, expr } => unary(op, expr, child),
        Expr::BinaryOp {
            op: op @ (BinaryOperator::And | BinaryOperator::Or),
            ..
        } => logic_chain(expr, op, child),
        Expr::BinaryOp { left, op, right } => binary(left, op, right, child),
        Expr::IsNull(x) => convert(x, child).map(is_null),
        Expr::IsNotNull(x) => convert(x, child).map(|n| Node::Not(Box::new(is_null(n)))),
        Expr::Between {
            expr,
            negated,
            low,
            high,
        } => between(expr, low, high, *negated, child),
        Expr::In {
            expr, target, negated, ..
        } => in_list(expr, target, *negated, child),
        Expr::IsTrue(_)
        | Expr::IsFalse(_)
        | Expr::IsNotTrue(_)
        | Expr::IsNotFalse(_)
        | Expr::IsUnknown(_)
        | Expr::IsNotUnknown(_)
        | Expr::IsDistinctFrom(..)
        | Expr::IsNotDistinctFrom(..) => Err(unsupported("IS form: only IS NULL and IS NOT NULL are supported")),
        Expr::Collate { .. } => Err(unsupported("operator COLLATE")),
        _ => Err(unsupported("expression")),
    }
}

fn unary(op: &UnaryOperator, operand: &Expr, depth: usize) -> Result<Node, String> {
    let node = convert(operand, depth)?;
    match op {
        UnaryOperator::Minus => Ok(Node::Negate(Box::new(node))),
        // RocketMQ's `+x` is `x` itself.
        UnaryOperator::Plus => Ok(node),
        UnaryOperator::Not => Ok(Node::Not(Box::new(as_boolean(node)?))),
        other => Err(unsupported_operator(other)),
    }
}

fn binary(left: &Expr, op: &BinaryOperator, right: &Expr, depth: usize) -> Result<Node, String> {
    let left = convert(left, depth)?;
    let right = convert(right, depth)?;
    match op {
        BinaryOperator::Eq => equal(left, right),
        BinaryOperator::NotEq => Ok(Node::Not(Box::new(equal(left, right)?))),
        BinaryOperator::Lt => compare(CompareOp::Lt, left, right),
        BinaryOperator::LtEq => compare(CompareOp::Le, left, right),
        BinaryOperator::Gt => compare(CompareOp::Gt, left, right),
        BinaryOperator::GtEq => compare(CompareOp::Ge, left, right),
        other => Err(unsupported_operator(other)),
    }
}

#[cold]
#[inline(never)]
fn unsupported(what: &str) -> String {
    format!("unsupported {what}")
}

#[cold]
#[inline(never)]
fn unsupported_operator(op: &dyn fmt::Display) -> String {
    format!("unsupported operator {op}")
}

/// A chain `x AND y AND z` (sqlparser nests it to the left) as one node,
/// walked without recursion.
fn logic_chain(expr: &Expr, op: &BinaryOperator, depth: usize) -> Result<Node, String> {
    let mut operands = Vec::new();
    let mut rest = expr;
    while let Expr::BinaryOp { left, op: o, right } = rest {
        if o != op {
            break;
        }
        operands.push(&**right);
        rest = left;
    }
    operands.push(rest);
    operands.reverse();
    let nodes = operands
        .into_iter()
        .map(|e| convert(e, depth).and_then(as_boolean))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if *op == BinaryOperator::And {
        Node::And(nodes)
    } else {
        Node::Or(nodes)
    })
}

fn literal(value: &SqlValue) -> Result<Literal, String> {
    match value {
        SqlValue::Number(text, long) => number(text, *long),
        SqlValue::SingleQuotedString(s) => Ok(Literal::Str(s.clone())),
        SqlValue::Boolean(b) => Ok(Literal::Bool(*b)),
        SqlValue::Null => Ok(Literal::Null),
        other => Err(format!("unsupported literal {other}")),
    }
}

fn number(text: &str, long_suffix: bool) -> Result<Literal, String> {
    if text.contains(['.', 'e', 'E']) {
        if long_suffix {
            return Err(format!("invalid number {text}L: the L suffix is for integers"));
        }
        let d: f64 = text.parse().map_err(|_| format!("invalid number {text}"))?;
        if d.is_infinite() {
            return Err(format!("{text} is greater than {:e}", f64::MAX));
        }
        return Ok(Literal::Double(d));
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(format!("invalid number {text}: leading zeros are not allowed"));
    }
    let l: i64 = text
        .parse()
        .map_err(|_| format!("integer {text} is out of range (the limit is {})", i64::MAX))?;
    Ok(match i32::try_from(l) {
        Ok(i) => Literal::Int(i),
        Err(_) => Literal::Long(l),
    })
}

/// RocketMQ's `asBooleanExpression`: a condition as it is, a property cast
/// to boolean, anything else an error.
pub(super) fn as_boolean(node: Node) -> Result<Node, String> {
    match node {
        n if n.is_boolean() => Ok(n),
        Node::Property(name) => Ok(Node::BoolCast(name)),
        other => Err(format!(
            "expression will not result in a boolean value: {}",
            other.describe()
        )),
    }
}

fn is_null(node: Node) -> Node {
    Node::Equal(Box::new(node), Box::new(Node::Literal(Literal::Null)))
}

/// `=` with `ComparisonExpression.createEqual`'s checks.
fn equal(left: Node, right: Node) -> Result<Node, String> {
    for side in [&left, &right] {
        if *side == Node::Literal(Literal::Null) {
            return Err("NULL cannot be compared with = or <>; use IS NULL or IS NOT NULL".to_owned());
        }
    }
    if let (Node::Literal(l @ Literal::Bool(_)), Node::Literal(r)) = (&left, &right)
        && !matches!(r, Literal::Bool(_))
    {
        return Err(format!("{l} cannot be compared with {r}"));
    }
    Ok(Node::Equal(Box::new(left), Box::new(right)))
}

/// `<`, `<=`, `>`, `>=` with `checkLessThanOperand` on both sides.
fn compare(op: CompareOp, left: Node, right: Node) -> Result<Node, String> {
    for side in [&left, &right] {
        match side {
            Node::Literal(Literal::Int(_) | Literal::Long(_) | Literal::Double(_)) => {}
            Node::Literal(l) => {
                return Err(format!("{l} cannot be compared with <, <=, > or >=: only numbers can"));
            }
            n if n.is_boolean() => {
                return Err("a condition cannot be compared with <, <=, > or >=".to_owned());
            }
            _ => {}
        }
    }
    Ok(Node::Compare(op, Box::new(left), Box::new(right)))
}

fn between(value: &Expr, low: &Expr, high: &Expr, negated: bool, depth: usize) -> Result<Node, String> {
    let value = convert(value, depth)?;
    let low = convert(low, depth)?;
    let high = convert(high, depth)?;
    if negated {
        return Ok(Node::Or(vec![
            compare(CompareOp::Lt, value.clone(), low)?,
            compare(CompareOp::Gt, value, high)?,
        ]));
    }
    // createBetween checks two literal bounds before anything else.
    if let (Node::Literal(lo), Node::Literal(hi)) = (&low, &high) {
        if *lo == Literal::Null || *hi == Literal::Null {
            return Err("BETWEEN bounds cannot be NULL".to_owned());
        }
        match java_compare(hi.value(), lo.value()) {
            Ok(Ordering::Less) => {
                return Err(format!(
                    "BETWEEN bounds out of order: {lo} must be less than or equal to {hi}"
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(format!("invalid BETWEEN bounds: {e}")),
        }
    }
    Ok(Node::And(vec![
        compare(CompareOp::Ge, value.clone(), low)?,
        compare(CompareOp::Le, value, high)?,
    ]))
}

fn in_list(left: &Expr, target: &InTarget, negated: bool, depth: usize) -> Result<Node, String> {
    let left = convert(left, depth)?;
    let Node::Property(property) = left else {
        return Err(format!("IN needs a property on its left, found {}", left.describe()));
    };
    let InTarget::List(items) = target else {
        return Err("IN takes a list of string literals".to_owned());
    };
    let mut values = BTreeSet::new();
    for item in items {
        match item {
            Expr::Value(v) => match &v.value {
                SqlValue::SingleQuotedString(s) => values.insert(s.clone()),
                _ => return Err("IN takes a list of string literals".to_owned()),
            },
            _ => return Err("IN takes a list of string literals".to_owned()),
        };
    }
    Ok(Node::In {
        property,
        values,
        negated,
    })
}

#[cold]
#[inline(never)]
pub(super) fn too_deep() -> String {
    format!("expression nested too deeply: the limit is {MAX_DEPTH} levels")
}
