//! RocketMQ's SQL92 message filter: the `FilterExpression` of type SQL a
//! consumer subscribes with (`MessageSelector.bySql` in the 4.x clients).
//! [`SqlFilter::parse`] reads an expression with the [`sqlparser`] crate and
//! turns it into a small tree of its own; [`SqlFilter::matches`] evaluates
//! that tree against a message's user properties and tag without touching
//! sqlparser again.
//!
//! # Grammar
//!
//! What RocketMQ's selector grammar accepts, loosest binding first (each
//! row's operators are left-associative):
//!
//! | level      | syntax                                                                  |
//! |------------|-------------------------------------------------------------------------|
//! | or         | `x OR y`                                                                |
//! | and        | `x AND y`                                                               |
//! | equality   | `x = y`, `x <> y`, `x IS NULL`, `x IS NOT NULL`                         |
//! | comparison | `x > y`, `>=`, `<`, `<=`, `x [NOT] BETWEEN lo AND hi`, `p [NOT] IN ('s', ...)` |
//! | unary      | `NOT x`, `-x`, `+x`                                                      |
//! | primary    | property, literal, `( expression )`                                     |
//!
//! - Properties are identifiers: an ASCII letter, `_` or `$`, then letters,
//!   digits, `_` or `$`; case-sensitive; the keywords above (and RocketMQ's
//!   `CONTAINS`, `STARTSWITH`, `ENDSWITH`) cannot be names. As an extension,
//!   a double-quoted name (`"x-trace.id"`) reads any other property.
//! - `TAGS` is the message's tag: RocketMQ keeps the tag in the property map
//!   under `TAGS` (`MessageConst.PROPERTY_TAGS`), so `TAGS IN ('a', 'b')`
//!   is the SQL form of the tag expression `a || b`. Here `TAGS` always reads
//!   the `tag` argument, never a user property (RocketMQ reserves the name).
//! - Literals: integers (`42`, `42L`; 32-bit ones are Java `int`s, larger
//!   ones `long`s, beyond 64 bits an error), decimals (`3.14`, `.5`, `5.`,
//!   `1e10`; Java `double`s), single-quoted strings with `''` for a quote,
//!   `TRUE`, `FALSE`, `NULL`. Keywords are case-insensitive. `--` and
//!   `/* */` comments are skipped.
//! - `IN` takes a property on its left and only string literals in its list.
//! - `BETWEEN lo AND hi` is `x >= lo AND x <= hi`, `NOT BETWEEN` is
//!   `x < lo OR x > hi`; two literal bounds must be in order (`5 AND 1` is
//!   an error; NOT BETWEEN is not checked, as in RocketMQ).
//! - `>`, `>=`, `<`, `<=` and BETWEEN reject string, boolean and NULL
//!   literals and boolean sub-expressions at parse time; `=` and `<>` reject
//!   a NULL literal (write `IS NULL`).
//! - Not supported (rejected with a message): `LIKE` (RocketMQ removed it
//!   from ActiveMQ's grammar), `[NOT] CONTAINS` / `STARTSWITH` / `ENDSWITH`
//!   (added in RocketMQ 5.1.3), arithmetic, functions, subqueries, `!=` and
//!   `==`, `IS TRUE` and the other IS forms.
//!
//! Note NOT's place: as in RocketMQ it binds tighter than any comparison,
//! so `NOT a = 'x'` is `(NOT a) = 'x'` (which never matches); write
//! `NOT (a = 'x')`. Likewise `NOT a IS NULL` is `(NOT a) IS NULL`, which
//! is the same as `a IS NULL`.
//!
//! # Values and comparisons
//!
//! Property values are strings. Values are compared as RocketMQ's
//! `ComparisonExpression` compares them, with the string conversion that
//! `SelectorParser` always switches on:
//!
//! | left             | right                   | comparison                                          |
//! |------------------|-------------------------|-----------------------------------------------------|
//! | string           | int literal             | string parsed as a 32-bit `int`                     |
//! | string           | long literal            | string parsed as a 64-bit `long`                    |
//! | string           | decimal literal         | string parsed as a `double`                         |
//! | string           | string                  | `=`, `<>`: exact equality; `<` etc.: both `double`s |
//! | string           | `TRUE` / `FALSE`        | string is `true` (any case) or not                  |
//! | number           | string                  | string parsed as the number's type                  |
//! | number           | number                  | numerically; `int` → `long` → `double` as needed    |
//! | `TRUE` / `FALSE` | string                  | evaluation error (RocketMQ fails on a cast)         |
//! | boolean          | number (or the reverse) | "less" without comparing, so `=` is FALSE           |
//!
//! - A string that does not parse is an evaluation error, not FALSE:
//!   `a > 5` with `a = "5.5"` is an error (5 is an `int`; write `a > 5.0`),
//!   as are `a = 1` with `a = "x"` and `a > 5` with `a = "3000000000"`.
//!   Integers parse like Java's `Integer.valueOf` / `Long.valueOf` (optional
//!   sign, ASCII digits, no blanks), doubles like `Double.valueOf` (blanks
//!   trimmed, `NaN`, `Infinity`, an `f`/`d` suffix; hexadecimal floats are
//!   not read).
//! - Doubles order as Java's `Double.compareTo`: `-0.0 < 0.0`, and `NaN`
//!   is above everything and equal to itself.
//!
//! # Unknown (NULL) and errors
//!
//! A missing property is NULL. Logic is three-valued, and the message
//! matches only if the whole expression is TRUE: a final NULL is no match.
//!
//! | x     | y     | NOT x | x AND y | x OR y |
//! |-------|-------|-------|---------|--------|
//! | TRUE  | NULL  | FALSE | NULL    | TRUE   |
//! | FALSE | NULL  | TRUE  | FALSE   | NULL   |
//! | NULL  | NULL  | NULL  | NULL    | NULL   |
//!
//! | with `a` missing                                         | value                           |
//! |----------------------------------------------------------|---------------------------------|
//! | `a = 'x'`, `a <> 'x'`, `a > 1`, `a IN ('x')`             | NULL, and `NOT (...)` NULL too  |
//! | `a [NOT] BETWEEN 1 AND 2`, `a NOT IN ('x')`              | NULL                            |
//! | `'x' = a` (anything non-null on the left)                | FALSE, so `'x' <> a` is TRUE    |
//! | `a = b` with both missing                                | TRUE                            |
//! | `a IS NULL` / `a IS NOT NULL`                            | TRUE / FALSE                    |
//! | `a` alone as a condition                                 | NULL (FALSE if present)         |
//!
//! The `'x' = a` asymmetry is RocketMQ's: its equality answers NULL when
//! only the left side is null and FALSE when only the right side is. A
//! property alone is FALSE when present because a string is not a boolean.
//!
//! An evaluation error (a conversion that fails, a boolean literal compared
//! with a string on its right) ends the evaluation and the message does not
//! match, whatever surrounds the error: RocketMQ's broker catches the
//! exception and counts the message as filtered out. AND and OR evaluate
//! left to right and stop at the first FALSE / TRUE, so an error to the
//! right of a deciding operand is never reached.
//!
//! # Limits
//!
//! Expressions come from the network: at most [`MAX_EXPRESSION_LEN`] bytes
//! and [`MAX_DEPTH`] levels of nesting (parentheses, NOT and signs, and
//! operators inside operators; a chain `x AND y AND z ...` is one level).
//! Operands are parsed by this module's sqlparser dialect hook, so the depth
//! is counted before recursing and sqlparser's own recursive forms
//! (subqueries, function arguments, subscripts) are never entered. sqlparser
//! keeps its `recursive-protection` feature: its infix parser takes tens of
//! KiB of stack per level in unoptimized builds, and the feature continues
//! a deep parse on a fresh stack segment instead of overflowing.
//!
//! # Differences from RocketMQ
//!
//! - Trailing text is an error (`a = 1 b`); RocketMQ's parser stops after
//!   the first complete expression and ignores the rest.
//! - Decimal literals `0.0`, `0.` and ones that underflow to zero are
//!   accepted; RocketMQ rejects them (its check compares with
//!   `Double.MIN_VALUE`, the smallest positive double).
//! - Integer literals with leading zeros (`007`) are rejected (RocketMQ reads
//!   `0` and ignores the rest); only an upper-case `L` suffix is read.
//! - Double-quoted property names are an extension; RocketMQ has none.
//! - `ANY`, `ALL`, `SOME` directly after a comparison or AND/OR are rejected
//!   (sqlparser reads them as SQL's quantified comparison); quote a property
//!   of that name.
//!
//! # Sources
//!
//! The behaviour is read from Apache RocketMQ's `filter` module (not copied):
//! the grammar in `org.apache.rocketmq.filter.parser.SelectorParser.jj`,
//! and `ComparisonExpression`, `LogicExpression`, `UnaryExpression`,
//! `ConstantExpression`, `BooleanConstantExpression` and `PropertyExpression`
//! in `org.apache.rocketmq.filter.expression`; the broker's
//! `ExpressionMessageFilter` (an exception or a non-TRUE result is no match)
//! and `MessageEvaluationContext` (the property map, tag included, as
//! strings); `MessageConst.PROPERTY_TAGS`; RocketMQ's filter documentation
//! (`docs/en/Example_Filter.md`, "Message Filtering" of the 5.0 docs).

mod eval;
mod parse;
#[cfg(test)]
mod tests;
mod tree;
mod value;

use std::fmt;

pub use tree::{MAX_DEPTH, TAGS};

use eval::eval;
use parse::parse_ast;
use tree::{Node, as_boolean, convert};
use value::Value;

/// Longest expression accepted, in bytes.
pub const MAX_EXPRESSION_LEN: usize = 4096;

/// A parsed SQL92 filter.
#[derive(Debug, Clone)]
pub struct SqlFilter {
    expression: String,
    root: Node,
}

/// Two filters are equal when they parse alike, however they were spelled
/// (spacing, the case of keywords).
impl PartialEq for SqlFilter {
    fn eq(&self, other: &Self) -> bool {
        self.root == other.root
    }
}

impl SqlFilter {
    /// Parses and validates an expression. The error says what is wrong, for
    /// the client (e.g. "unsupported operator LIKE at line 1, column 3").
    pub fn parse(expr: &str) -> Result<SqlFilter, String> {
        if expr.len() > MAX_EXPRESSION_LEN {
            return Err(format!(
                "expression too long: {} bytes, the limit is {MAX_EXPRESSION_LEN}",
                expr.len()
            ));
        }
        if expr.trim().is_empty() {
            return Err("empty expression".to_owned());
        }
        let ast = parse_ast(expr)?;
        let root = as_boolean(convert(&ast, 0)?)?;
        Ok(SqlFilter {
            expression: expr.to_owned(),
            root,
        })
    }

    /// Whether a message with these user properties and this tag matches.
    /// `properties` looks a user property up by name, e.g.
    /// `|name| props.get(name).map(String::as_str)`; `TAGS` is answered from
    /// `tag` without asking it. Never panics; an evaluation error is no match.
    pub fn matches<'a>(&self, properties: impl Fn(&str) -> Option<&'a str>, tag: Option<&'a str>) -> bool {
        matches!(self.evaluate(properties, tag), Ok(Some(true)))
    }

    /// The three-valued result behind [`matches`](Self::matches): `Some` of
    /// TRUE or FALSE, `None` for NULL (unknown), or the evaluation error.
    pub fn evaluate<'a>(
        &self,
        properties: impl Fn(&str) -> Option<&'a str>,
        tag: Option<&'a str>,
    ) -> Result<Option<bool>, String> {
        let lookup = |name: &str| if name == TAGS { tag } else { properties(name) };
        match eval(&self.root, &lookup)? {
            Value::Bool(b) => Ok(Some(b)),
            Value::Null => Ok(None),
            other => Err(format!("the expression gave {other}, not a boolean")),
        }
    }

    /// The expression as given to [`parse`](Self::parse).
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

impl fmt::Display for SqlFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expression)
    }
}
