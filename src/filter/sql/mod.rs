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

use std::cell::{Cell, RefCell};
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;

use sqlparser::ast::{BinaryOperator, Expr, Ident, InTarget, UnaryOperator, Value as SqlValue};
use sqlparser::dialect::Dialect;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

/// Longest expression accepted, in bytes.
pub const MAX_EXPRESSION_LEN: usize = 4096;
/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 64;
/// The property name under which an expression reads the message's tag.
pub const TAGS: &str = "TAGS";

// Binding strengths handed to sqlparser's operator-precedence loop; a token
// with precedence 0 ends an expression.
const PREC_OR: u8 = 5;
const PREC_AND: u8 = 10;
const PREC_IS: u8 = 17;
const PREC_EQUALITY: u8 = 18;
const PREC_COMPARISON: u8 = 20;
const PREC_UNARY: u8 = 30;
/// sqlparser's own recursion guard, a backstop behind [`MAX_DEPTH`]: each
/// level of nesting costs at most one call per precedence level.
const PARSER_RECURSION_LIMIT: usize = 8 * MAX_DEPTH;

/// A parsed SQL92 filter.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlFilter {
    expression: String,
    root: Node,
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

// ---------------------------------------------------------------------------
// Parsing: sqlparser's tokenizer and precedence loop, with RocketMQ's prefix
// grammar and operator table supplied through a dialect.

/// sqlparser dialect for RocketMQ selectors. The prefix hook parses every
/// operand itself (properties, literals, parentheses, NOT and signs), so
/// RocketMQ's names and NOT's binding apply, the nesting depth is counted
/// before recursing, and none of SQL's other prefix forms (CASE, CAST,
/// subqueries, arrays, ...) can start. The precedence hook gives a
/// precedence only to RocketMQ's operators; any other token ends the
/// expression and is reported as left over.
#[derive(Debug, Default)]
struct SelectorDialect {
    depth: Cell<usize>,
    /// The first error this dialect raised, to report instead of
    /// sqlparser's rendering of it.
    error: RefCell<Option<String>>,
}

impl Dialect for SelectorDialect {
    fn is_identifier_start(&self, ch: char) -> bool {
        ch.is_ascii_alphabetic() || ch == '_' || ch == '$'
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        ch.is_ascii_alphanumeric() || ch == '_' || ch == '$'
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        ch == '"'
    }

    fn parse_prefix(&self, parser: &mut Parser) -> Option<Result<Expr, ParserError>> {
        Some(self.prefix(parser))
    }

    fn get_next_precedence(&self, parser: &Parser) -> Option<Result<u8, ParserError>> {
        Some(Ok(next_precedence(parser)))
    }

    fn parse_infix(&self, parser: &mut Parser, _expr: &Expr, _precedence: u8) -> Option<Result<Expr, ParserError>> {
        // sqlparser parses the operators next_precedence admits; this only
        // keeps it away from its subquery forms.
        self.infix_guard(parser).map(Err)
    }
}

impl SelectorDialect {
    fn fail(&self, message: String) -> ParserError {
        let mut first = self.error.borrow_mut();
        if first.is_none() {
            *first = Some(message.clone());
        }
        ParserError::ParserError(message)
    }

    /// Runs `parse` one nesting level deeper.
    fn nested(
        &self,
        parser: &mut Parser,
        at: Location,
        parse: impl FnOnce(&mut Parser) -> Result<Expr, ParserError>,
    ) -> Result<Expr, ParserError> {
        let depth = self.depth.get() + 1;
        if depth > MAX_DEPTH {
            return Err(self.fail(format!("{} (at {})", too_deep(), position(at))));
        }
        self.depth.set(depth);
        let result = parse(parser);
        self.depth.set(depth - 1);
        result
    }

    fn unary(&self, parser: &mut Parser, at: Location, op: UnaryOperator) -> Result<Expr, ParserError> {
        self.nested(parser, at, |p| {
            let operand = p.parse_subexpr(PREC_UNARY)?;
            Ok(Expr::UnaryOp {
                op,
                expr: Box::new(operand),
            })
        })
    }

    fn prefix(&self, parser: &mut Parser) -> Result<Expr, ParserError> {
        let TokenWithSpan { token, span } = parser.next_token();
        let at = span.start;
        let mut is_property = false;
        let expr = match token {
            Token::Word(w) if w.quote_style == Some('"') => {
                if w.value.is_empty() {
                    return Err(self.fail(format!("empty property name at {}", position(at))));
                }
                is_property = true;
                Expr::Identifier(Ident::with_quote('"', w.value))
            }
            Token::Word(w) if w.quote_style.is_none() => match w.value.to_ascii_uppercase().as_str() {
                "NOT" => return self.unary(parser, at, UnaryOperator::Not),
                "TRUE" => Expr::Value(SqlValue::Boolean(true).with_empty_span()),
                "FALSE" => Expr::Value(SqlValue::Boolean(false).with_empty_span()),
                "NULL" => Expr::Value(SqlValue::Null.with_empty_span()),
                keyword @ ("AND" | "OR" | "IS" | "IN" | "BETWEEN") => {
                    return Err(self.fail(format!(
                        "syntax error at {}: expected an expression, found {keyword}",
                        position(at)
                    )));
                }
                keyword @ ("CONTAINS" | "STARTSWITH" | "ENDSWITH") => {
                    return Err(self.fail(unsupported_extension(keyword, at)));
                }
                _ => {
                    if parser.peek_token_ref().token == Token::LParen {
                        return Err(self.fail(format!(
                            "unsupported function call {}(...) at {}: functions are not supported",
                            w.value,
                            position(at)
                        )));
                    }
                    is_property = true;
                    Expr::Identifier(Ident::new(w.value))
                }
            },
            Token::Number(text, long) => Expr::Value(SqlValue::Number(text, long).with_empty_span()),
            Token::SingleQuotedString(s) => Expr::Value(SqlValue::SingleQuotedString(s).with_empty_span()),
            Token::LParen => self.nested(parser, at, |p| {
                let inner = p.parse_expr()?;
                if !p.consume_token(&Token::RParen) {
                    let next = p.peek_token_ref();
                    return Err(self.fail(match next.token {
                        Token::EOF => format!("syntax error: missing ')' to close the '(' at {}", position(at)),
                        _ => format!(
                            "syntax error at {}: expected ')' to close the '(' at {}, found {}",
                            position(next.span.start),
                            position(at),
                            describe_token(&next.token)
                        ),
                    }));
                }
                Ok(Expr::Nested(Box::new(inner)))
            })?,
            Token::Minus => return self.unary(parser, at, UnaryOperator::Minus),
            Token::Plus => return self.unary(parser, at, UnaryOperator::Plus),
            Token::EOF => {
                return Err(
                    self.fail("syntax error: expected an expression, found the end of the expression".to_owned())
                );
            }
            other => {
                return Err(self.fail(format!(
                    "syntax error at {}: expected an expression, found {}",
                    position(at),
                    describe_token(&other)
                )));
            }
        };
        // sqlparser would read on into field access or subscripts.
        let next = parser.peek_token_ref();
        match next.token {
            Token::Period if is_property => Err(self.fail(format!(
                "property names cannot contain '.' (at {}); quote such a name: \"a.b\"",
                position(next.span.start)
            ))),
            Token::Period | Token::LBracket => Err(self.fail(format!(
                "unsupported operator {} at {}",
                next.token,
                position(next.span.start)
            ))),
            _ => Ok(expr),
        }
    }

    fn infix_guard(&self, parser: &Parser) -> Option<ParserError> {
        let op = &parser.peek_token_ref().token;
        if is_keyword(op, "IS") {
            let (t1, t2) = (&parser.peek_nth_token_ref(1).token, &parser.peek_nth_token_ref(2).token);
            if is_keyword(t1, "NULL") || (is_keyword(t1, "NOT") && is_keyword(t2, "NULL")) {
                return None;
            }
            let at = parser.peek_token_ref().span.start;
            return Some(self.fail(format!(
                "unsupported IS form at {}: only IS NULL and IS NOT NULL are supported",
                position(at)
            )));
        }
        let not_in = is_keyword(op, "NOT") && is_keyword(&parser.peek_nth_token_ref(1).token, "IN");
        if not_in || is_keyword(op, "IN") {
            let list = if not_in { 2 } else { 1 };
            let open = &parser.peek_nth_token_ref(list).token;
            let first = &parser.peek_nth_token_ref(list + 1).token;
            if *open != Token::LParen || !matches!(first, Token::SingleQuotedString(_)) {
                let at = parser.peek_nth_token_ref(list).span.start;
                return Some(self.fail(format!(
                    "IN takes a parenthesized list of string literals, like a IN ('x', 'y') (at {})",
                    position(at)
                )));
            }
            return None;
        }
        let binary = matches!(
            op,
            Token::Eq | Token::Neq | Token::Lt | Token::LtEq | Token::Gt | Token::GtEq
        ) || is_keyword(op, "AND")
            || is_keyword(op, "OR");
        let next = parser.peek_nth_token_ref(1);
        if binary && ["ANY", "ALL", "SOME"].iter().any(|k| is_keyword(&next.token, k)) {
            return Some(self.fail(format!(
                "unsupported {} at {}: quantified comparisons are not supported (quote a property of that name)",
                next.token,
                position(next.span.start)
            )));
        }
        None
    }
}

/// Whether `token` is the unquoted keyword `upper`.
fn is_keyword(token: &Token, upper: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(upper))
}

fn next_precedence(parser: &Parser) -> u8 {
    let token = &parser.peek_token_ref().token;
    match token {
        Token::Eq | Token::Neq => PREC_EQUALITY,
        Token::Lt | Token::LtEq | Token::Gt | Token::GtEq => PREC_COMPARISON,
        _ if is_keyword(token, "OR") => PREC_OR,
        _ if is_keyword(token, "AND") => PREC_AND,
        _ if is_keyword(token, "IS") => PREC_IS,
        _ if is_keyword(token, "IN") || is_keyword(token, "BETWEEN") => PREC_COMPARISON,
        _ if is_keyword(token, "NOT") => {
            let next = &parser.peek_nth_token_ref(1).token;
            if is_keyword(next, "IN") || is_keyword(next, "BETWEEN") {
                PREC_COMPARISON
            } else {
                0
            }
        }
        _ => 0,
    }
}

fn parse_ast(expr: &str) -> Result<Expr, String> {
    let dialect = SelectorDialect::default();
    let tokens = Tokenizer::new(&dialect, expr)
        .tokenize_with_location()
        .map_err(|e| format!("syntax error: {e}"))?;
    // sqlparser reads `!=` as `<>`; RocketMQ has only `<>`.
    if let Some(t) = tokens
        .iter()
        .find(|t| t.token == Token::Neq && char_at(expr, t.span.start) == Some('!'))
    {
        return Err(format!("unsupported operator != at {}: use <>", position(t.span.start)));
    }
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(PARSER_RECURSION_LIMIT)
        .with_tokens_with_locations(tokens);
    let ast = match parser.parse_expr() {
        Ok(ast) => ast,
        Err(e) => {
            return Err(dialect.error.take().unwrap_or_else(|| match e {
                ParserError::RecursionLimitExceeded => too_deep(),
                ParserError::TokenizerError(s) | ParserError::ParserError(s) => format!("syntax error: {s}"),
            }));
        }
    };
    if parser.peek_token_ref().token != Token::EOF {
        return Err(left_over(&parser));
    }
    Ok(ast)
}

/// The error for a token after a complete expression.
fn left_over(parser: &Parser) -> String {
    #[rustfmt::skip]
    const WORD_OPERATORS: [&str; 14] = [
        "LIKE", "ILIKE", "RLIKE", "REGEXP", "SIMILAR", "GLOB", "MATCH", "CONTAINS", "STARTSWITH", "ENDSWITH", "XOR",
        "DIV", "COLLATE", "OVERLAPS",
    ];
    let word_operator = |token: &Token| WORD_OPERATORS.into_iter().find(|k| is_keyword(token, k));
    let t = parser.peek_token_ref();
    let at = t.span.start;
    if let Some(op) = word_operator(&t.token) {
        return match op {
            "CONTAINS" | "STARTSWITH" | "ENDSWITH" => unsupported_extension(op, at),
            _ => format!("unsupported operator {op} at {}", position(at)),
        };
    }
    if is_keyword(&t.token, "NOT")
        && let Some(op) = word_operator(&parser.peek_nth_token_ref(1).token)
    {
        return match op {
            "CONTAINS" | "STARTSWITH" | "ENDSWITH" => unsupported_extension(&format!("NOT {op}"), at),
            _ => format!("unsupported operator NOT {op} at {}", position(at)),
        };
    }
    match &t.token {
        Token::RParen => format!("syntax error at {}: unbalanced ')'", position(at)),
        Token::Plus
        | Token::Minus
        | Token::Mul
        | Token::Div
        | Token::Mod
        | Token::StringConcat
        | Token::Pipe
        | Token::Ampersand
        | Token::Caret
        | Token::DoubleEq
        | Token::Spaceship
        | Token::ShiftLeft
        | Token::ShiftRight
        | Token::DoubleColon
        | Token::Assignment
        | Token::Arrow
        | Token::LongArrow
        | Token::Tilde
        | Token::ExclamationMark
        | Token::Period
        | Token::LBracket
        | Token::Colon => format!("unsupported operator {} at {}", t.token, position(at)),
        other => format!(
            "syntax error at {}: unexpected {} after a complete expression",
            position(at),
            describe_token(other)
        ),
    }
}

fn unsupported_extension(op: &str, at: Location) -> String {
    format!(
        "unsupported operator {op} at {}: RocketMQ 5.1.3's CONTAINS, STARTSWITH and ENDSWITH are not supported",
        position(at)
    )
}

#[cold]
#[inline(never)]
fn too_deep() -> String {
    format!("expression nested too deeply: the limit is {MAX_DEPTH} levels")
}

fn position(at: Location) -> String {
    format!("line {}, column {}", at.line, at.column)
}

fn describe_token(token: &Token) -> String {
    match token {
        Token::EOF => "the end of the expression".to_owned(),
        other => format!("'{other}'"),
    }
}

/// The character at a tokenizer location (lines split at '\n', columns
/// counted in characters, both from 1).
fn char_at(text: &str, at: Location) -> Option<char> {
    let line = text.split('\n').nth(usize::try_from(at.line).ok()?.checked_sub(1)?)?;
    line.chars().nth(usize::try_from(at.column).ok()?.checked_sub(1)?)
}

// ---------------------------------------------------------------------------
// The expression tree, built with RocketMQ's parse-time checks.

#[derive(Debug, Clone, PartialEq)]
enum Literal {
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
    fn value(&self) -> Value<'_> {
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
enum CompareOp {
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    fn holds(self, ord: Ordering) -> bool {
        match self {
            CompareOp::Lt => ord == Ordering::Less,
            CompareOp::Le => ord != Ordering::Greater,
            CompareOp::Gt => ord == Ordering::Greater,
            CompareOp::Ge => ord != Ordering::Less,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
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
fn convert(expr: &Expr, depth: usize) -> Result<Node, String> {
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
fn as_boolean(node: Node) -> Result<Node, String> {
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

// ---------------------------------------------------------------------------
// Evaluation, with Java's types and conversions.

/// A value during evaluation: RocketMQ's Java objects.
#[derive(Debug, Clone, Copy)]
enum Value<'v> {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    Str(&'v str),
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Bool(true) => f.write_str("TRUE"),
            Value::Bool(false) => f.write_str("FALSE"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Long(l) => write!(f, "{l}"),
            Value::Double(d) => write!(f, "{d:?}"),
            Value::Str(s) => write!(f, "'{}'", s.replace('\'', "''")),
        }
    }
}

fn eval<'v>(node: &'v Node, lookup: &dyn Fn(&str) -> Option<&'v str>) -> Result<Value<'v>, String> {
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

/// `ComparisonExpression.__compare` with string conversion on: values of
/// different types are converted to the other side's type where Java can
/// (a failed conversion is an error), and compared as "less" where it does
/// not try.
fn java_compare(left: Value, right: Value) -> Result<Ordering, String> {
    use Value::{Bool, Double, Int, Long, Null, Str};
    Ok(match (left, right) {
        (Bool(a), Bool(b)) => a.cmp(&b),
        (Int(a), Int(b)) => a.cmp(&b),
        (Long(a), Long(b)) => a.cmp(&b),
        (Double(a), Double(b)) => java_double_cmp(a, b),
        // Java orders UTF-16 units; only equality is ever asked of two strings.
        (Str(a), Str(b)) => a.cmp(b),
        (Int(a), Long(b)) => i64::from(a).cmp(&b),
        (Long(a), Int(b)) => a.cmp(&i64::from(b)),
        (Int(a), Double(b)) => java_double_cmp(f64::from(a), b),
        (Double(a), Int(b)) => java_double_cmp(a, f64::from(b)),
        (Long(a), Double(b)) => java_double_cmp(a as f64, b),
        (Double(a), Long(b)) => java_double_cmp(a, b as f64),
        (Int(a), Str(b)) => a.cmp(&parse_int(b)?),
        (Long(a), Str(b)) => a.cmp(&parse_long(b)?),
        (Double(a), Str(b)) => java_double_cmp(a, parse_double(b)?),
        (Str(a), Int(b)) => parse_int(a)?.cmp(&b),
        (Str(a), Long(b)) => parse_long(a)?.cmp(&b),
        (Str(a), Double(b)) => java_double_cmp(parse_double(a)?, b),
        (Str(a), Bool(b)) => a.eq_ignore_ascii_case("true").cmp(&b),
        // RocketMQ casts the boolean to a string here and fails.
        (Bool(a), Str(b)) => return Err(format!("{} cannot be compared with {}", Bool(a), Str(b))),
        // A boolean and a number: RocketMQ answers "less" without comparing.
        (Bool(_), _) | (_, Bool(_)) => Ordering::Less,
        (Null, _) | (_, Null) => return Err("NULL in a comparison".to_owned()),
    })
}

/// Java's `Double.compareTo`: numeric order, but `-0.0 < 0.0` and NaN above
/// everything and equal to itself.
fn java_double_cmp(a: f64, b: f64) -> Ordering {
    if a < b {
        return Ordering::Less;
    }
    if a > b {
        return Ordering::Greater;
    }
    // Equal, zeros of either sign, or NaN: Java compares doubleToLongBits
    // (one NaN for all) as signed longs.
    let bits = |d: f64| {
        if d.is_nan() {
            0x7ff8_0000_0000_0000_i64
        } else {
            d.to_bits() as i64
        }
    };
    bits(a).cmp(&bits(b))
}

/// Java's `Integer.valueOf(String)`: optional sign, ASCII digits, 32 bits.
fn parse_int(s: &str) -> Result<i32, String> {
    s.parse().map_err(|_| format!("'{s}' is not an int"))
}

/// Java's `Long.valueOf(String)`.
fn parse_long(s: &str) -> Result<i64, String> {
    s.parse().map_err(|_| format!("'{s}' is not a long"))
}

/// Java's `Double.valueOf(String)` for decimal text: blanks (up to U+0020)
/// trimmed, optional sign, `NaN`, `Infinity`, or digits with an optional
/// point and exponent and an optional `f`/`F`/`d`/`D` suffix.
fn parse_double(s: &str) -> Result<f64, String> {
    let err = || format!("'{s}' is not a double");
    let t = s.trim_matches(|c: char| c <= ' ');
    let (negative, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let magnitude = match body {
        "NaN" => f64::NAN,
        "Infinity" => f64::INFINITY,
        _ => {
            let digits = body.strip_suffix(['f', 'F', 'd', 'D']).unwrap_or(body);
            // Rust's grammar is Java's decimal one, plus "inf" and "nan".
            let decimal = digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
                && digits.bytes().all(|b| b.is_ascii_digit() || b".eE+-".contains(&b));
            if !decimal {
                return Err(err());
            }
            digits.parse().map_err(|_| err())?
        }
    };
    Ok(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    type Props = &'static [(&'static str, &'static str)];

    fn lookup(props: Props) -> impl Fn(&str) -> Option<&'static str> {
        move |name| props.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    fn eval_str(expr: &str, props: Props, tag: Option<&'static str>) -> Result<Option<bool>, String> {
        SqlFilter::parse(expr)
            .unwrap_or_else(|e| panic!("{expr:?} does not parse: {e}"))
            .evaluate(lookup(props), tag)
    }

    #[test]
    fn matches_table() {
        const NONE: Props = &[];
        #[rustfmt::skip]
        let cases: &[(&str, Props, Option<&'static str>, bool)] = &[
            // numeric comparisons against numeric strings
            ("a > 5", &[("a", "10")], None, true),
            ("a > 5", &[("a", "5")], None, false),
            ("a >= 5", &[("a", "5")], None, true),
            ("a < 5", &[("a", "-3")], None, true),
            ("a <= 5", &[("a", "6")], None, false),
            ("a = 10", &[("a", "10")], None, true),
            ("a = 10", &[("a", "+10")], None, true),
            ("a <> 10", &[("a", "10")], None, false),
            ("a <> 10", &[("a", "11")], None, true),
            ("10 < a", &[("a", "11")], None, true),
            ("a > -5", &[("a", "-4")], None, true),
            ("a > - -5", &[("a", "4")], None, false),
            ("a > +5", &[("a", "6")], None, true),
            // 2147483648 is a long, so a 64-bit value compares
            ("a > 2147483648", &[("a", "3000000000")], None, true),
            ("a > 5L", &[("a", "6")], None, true),
            // decimals
            ("a > 3.14", &[("a", "3.1415")], None, true),
            ("a > 3.1E10", &[("a", "31415000000")], None, true),
            ("a = 1.5", &[("a", "1.50")], None, true),
            ("a > 5.0", &[("a", "5.5")], None, true),
            ("a < .5", &[("a", "0.25")], None, true),
            ("a >= 0.0", &[("a", "0")], None, true),
            ("a > 1e3", &[("a", " 1001 ")], None, true),
            ("a > 1", &[("a", "2")], None, true),
            ("5 = 5.0", NONE, None, true),
            ("a = 0.0", &[("a", "-0.0")], None, false),
            ("a > 1.0", &[("a", "NaN")], None, true),
            ("a > 1.0", &[("a", "1.5f")], None, true),
            // two properties: = compares strings, > compares doubles
            ("a > b", &[("a", "20"), ("b", "10")], None, true),
            ("a > b", &[("a", "10"), ("b", "20")], None, false),
            ("a > b", &[("a", "10"), ("b", "9.5")], None, true),
            ("a = b", &[("a", "3.14"), ("b", "3.14")], None, true),
            ("a = b", &[("a", "1"), ("b", "1.0")], None, false),
            ("a <> b", &[("a", "3.14"), ("b", "3.141")], None, true),
            // strings
            ("b = 'abc'", &[("b", "abc")], None, true),
            ("b = 'abc'", &[("b", "ABC")], None, false),
            ("b <> 'abc'", &[("b", "abd")], None, true),
            ("b = 'it''s'", &[("b", "it's")], None, true),
            ("b = ''", &[("b", "")], None, true),
            ("b = '10'", &[("b", "10.0")], None, false),
            ("b IN ('x', 'y')", &[("b", "y")], None, true),
            ("b IN ('x', 'y')", &[("b", "z")], None, false),
            ("b NOT IN ('x', 'y')", &[("b", "z")], None, true),
            ("b NOT IN ('x', 'y')", &[("b", "x")], None, false),
            ("b IN ('3', '4')", &[("b", "3.0")], None, false),
            // the tag is TAGS
            ("TAGS = 'TagA'", NONE, Some("TagA"), true),
            ("TAGS IN ('TagA', 'TagB')", NONE, Some("TagB"), true),
            ("TAGS IN ('TagA', 'TagB')", NONE, Some("TagC"), false),
            ("TAGS IN ('TagA', 'TagB')", NONE, None, false),
            ("TAGS NOT IN ('TagA')", NONE, None, false),
            ("TAGS IS NULL", NONE, None, true),
            ("TAGS IS NOT NULL AND TAGS = '''''tag'''''", NONE, Some("''tag''"), true),
            ("TAGS = 'TagA'", &[("TAGS", "TagA")], None, false),
            ("tags = 'TagA'", &[("tags", "TagA")], Some("TagB"), true),
            ("TAGS = 'TagA' AND a > 1", &[("a", "2")], Some("TagA"), true),
            // BETWEEN includes both bounds
            ("a BETWEEN 2 AND 10", &[("a", "2")], None, true),
            ("a BETWEEN 2 AND 10", &[("a", "10")], None, true),
            ("a BETWEEN 2 AND 10", &[("a", "1")], None, false),
            ("a BETWEEN 2 AND 10", &[("a", "11")], None, false),
            ("a BETWEEN 2 AND 2", &[("a", "2")], None, true),
            ("a BETWEEN 1.5 AND 2.0", &[("a", "1.75")], None, true),
            ("a BETWEEN -10 AND -20", &[("a", "-15")], None, false),
            ("a NOT BETWEEN 2 AND 10", &[("a", "1")], None, true),
            ("a NOT BETWEEN 2 AND 10", &[("a", "11")], None, true),
            ("a NOT BETWEEN 2 AND 10", &[("a", "2")], None, false),
            ("a NOT BETWEEN 2 AND 10", &[("a", "10")], None, false),
            ("a BETWEEN lo AND hi", &[("a", "5"), ("lo", "1"), ("hi", "9")], None, true),
            ("a BETWEEN 1 AND 3 AND b = 'x'", &[("a", "2"), ("b", "x")], None, true),
            // missing properties: unknown, never a match
            ("a = 'x'", NONE, None, false),
            ("a <> 'x'", NONE, None, false),
            ("NOT (a = 'x')", NONE, None, false),
            ("a > 5", NONE, None, false),
            ("NOT (a > 5)", NONE, None, false),
            ("a BETWEEN 1 AND 2", NONE, None, false),
            ("a NOT BETWEEN 1 AND 2", NONE, None, false),
            ("a NOT IN ('x')", NONE, None, false),
            ("a IS NULL", NONE, None, true),
            ("a IS NOT NULL", NONE, None, false),
            ("a IS NULL", &[("a", "")], None, false),
            ("a IS NOT NULL AND a > 5", &[("a", "6")], None, true),
            ("a IS NULL OR a = 'hello'", NONE, None, true),
            ("a IS NULL OR a = 'hello'", &[("a", "hello")], None, true),
            ("a IS NULL OR a = 'hello'", &[("a", "abc")], None, false),
            ("a = 'x' OR b = 'y'", &[("b", "y")], None, true),
            ("a = 'x' AND b = 'y'", &[("b", "y")], None, false),
            ("NOT (a = 'x' AND b = 'y')", &[("b", "z")], None, true),
            ("NOT (a = 'x' OR b = 'y')", &[("b", "z")], None, false),
            // RocketMQ's asymmetric equality
            ("'x' = a", NONE, None, false),
            ("'x' <> a", NONE, None, true),
            ("a = b", NONE, None, true),
            ("a = b", &[("a", "1")], None, false),
            // booleans
            ("TRUE", NONE, None, true),
            ("FALSE", NONE, None, false),
            ("NULL", NONE, None, false),
            ("NOT FALSE", NONE, None, true),
            ("NOT NULL", NONE, None, false),
            ("TRUE OR NULL", NONE, None, true),
            ("TRUE AND NULL", NONE, None, false),
            ("true = TRUE", NONE, None, true),
            ("c = TRUE", &[("c", "true")], None, true),
            ("c = TRUE", &[("c", "TRUE")], None, true),
            ("c = FALSE", &[("c", "yes")], None, true),
            ("a = TRUE OR b = FALSE", &[("a", "true"), ("b", "false")], None, true),
            ("a = TRUE OR b = FALSE", &[("a", "false"), ("b", "true")], None, false),
            ("1 = TRUE", NONE, None, false),
            ("c", &[("c", "true")], None, false),
            ("NOT c", &[("c", "true")], None, true),
            ("NOT c", NONE, None, false),
            ("(a = 1) = TRUE", &[("a", "1")], None, true),
            // precedence: AND before OR; NOT binds tightest
            ("a = 1 OR b = 1 AND c = 1", &[("a", "1")], None, true),
            ("(a = 1 OR b = 1) AND c = 1", &[("a", "1")], None, false),
            ("a = 1 OR b = 1 AND c = 1", &[("b", "1"), ("c", "1")], None, true),
            ("a = 1 AND b = 1 OR c = 1", &[("c", "1")], None, true),
            ("NOT a = 'x'", &[("a", "y")], None, false),
            ("NOT (a = 'x')", &[("a", "y")], None, true),
            ("NOT a IS NULL", NONE, None, true),
            ("NOT (a IS NULL)", NONE, None, false),
            ("NOT NOT (a = 'x')", &[("a", "x")], None, true),
            ("a = 1 AND NOT (b = 2)", &[("a", "1"), ("b", "3")], None, true),
            ("((a = 1))", &[("a", "1")], None, true),
            ("a > 1 = TRUE", &[("a", "2")], None, true),
            ("a IS NULL = TRUE", NONE, None, true),
            ("a = 3 and b <> 4 And c > 5 AND d <= 4", &[("a", "3"), ("b", "5"), ("c", "6"), ("d", "1")], None, true),
            ("a=3 or b<>4 Or c>5 OR d<=4", &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "2")], None, true),
            ("a=3 or b<>4 Or c>5 OR d<=4", &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "10")], None, false),
            // comments, case, odd names
            ("a = 1 -- trailing comment", &[("a", "1")], None, true),
            ("/* lead */ a = 1", &[("a", "1")], None, true),
            ("A = 1", &[("a", "1")], None, false),
            ("a_b$1 = 'x' and $c = 'y' and _d = 'z'", &[("a_b$1", "x"), ("$c", "y"), ("_d", "z")], None, true),
            ("\"x-trace.id\" = 'abc'", &[("x-trace.id", "abc")], None, true),
            ("type = 'x' AND date = 'y' AND select = 'z' AND value = 'v'",
                &[("type", "x"), ("date", "y"), ("select", "z"), ("value", "v")], None, true),
            ("interval = 1 OR timestamp = 2 OR user = 3 OR key = 4", &[("key", "4")], None, true),
        ];
        for (expr, props, tag, want) in cases {
            let filter = SqlFilter::parse(expr).unwrap_or_else(|e| panic!("{expr:?} does not parse: {e}"));
            assert_eq!(
                filter.matches(lookup(props), *tag),
                *want,
                "{expr:?} with {props:?}, tag {tag:?}: {:?}",
                filter.evaluate(lookup(props), *tag)
            );
        }
    }

    #[test]
    fn three_valued_results_and_errors() {
        let ok = |b| Ok(Some(b));
        // unknown versus false
        assert_eq!(eval_str("a = 'x'", &[], None), Ok(None));
        assert_eq!(eval_str("'x' = a", &[], None), ok(false));
        assert_eq!(eval_str("a", &[], None), Ok(None));
        assert_eq!(eval_str("a", &[("a", "true")], None), ok(false));
        assert_eq!(eval_str("a = 'x' AND FALSE", &[], None), ok(false));
        assert_eq!(eval_str("a = 'x' OR TRUE", &[], None), ok(true));
        assert_eq!(eval_str("a = 'x' OR FALSE", &[], None), Ok(None));
        assert_eq!(eval_str("NOT (a > 1)", &[], None), Ok(None));
        // conversions that fail are errors, not FALSE
        assert!(eval_str("a > 5", &[("a", "abc")], None).is_err());
        assert!(eval_str("a > 5", &[("a", "5.5")], None).is_err(), "5 is an int");
        assert!(eval_str("a > 5", &[("a", "3000000000")], None).is_err(), "5 is an int");
        assert!(eval_str("a = 1", &[("a", "x")], None).is_err());
        assert!(eval_str("a = 1", &[("a", " 1")], None).is_err());
        assert!(eval_str("a > b", &[("a", "1"), ("b", "x")], None).is_err());
        assert!(eval_str("a > 1.0", &[("a", "0x10")], None).is_err());
        assert!(eval_str("a > 1.0", &[("a", "inf")], None).is_err());
        assert!(eval_str("TRUE = a", &[("a", "true")], None).is_err());
        assert!(eval_str("a BETWEEN 0 AND 100", &[("a", "abc")], None).is_err());
        assert!(
            eval_str("a BETWEEN 1.5 AND 2", &[("a", "1.75")], None).is_err(),
            "2 is an int"
        );
        // an error anywhere evaluated is no match, even under OR or NOT
        for expr in ["a > 5 OR b = 'y'", "NOT (a > 5)", "b = 'y' AND a > 5"] {
            let filter = SqlFilter::parse(expr).unwrap();
            assert!(!filter.matches(lookup(&[("a", "abc"), ("b", "y")]), None), "{expr}");
        }
        // but an operand that decides AND/OR first stops the evaluation
        assert_eq!(
            eval_str("b = 'y' OR a > 5", &[("a", "abc"), ("b", "y")], None),
            ok(true)
        );
        assert_eq!(
            eval_str("b = 'n' AND a > 5", &[("a", "abc"), ("b", "y")], None),
            ok(false)
        );
        assert_eq!(eval_str("a IS NULL OR a > 5", &[], None), ok(true));
    }

    #[test]
    fn rejects_malformed_and_unsupported() {
        let five_kib = format!("a = '{}'", "x".repeat(5 * 1024));
        let deep = format!("{}a = 1{}", "(".repeat(1000), ")".repeat(1000));
        let not_chain = format!("{}a", "NOT ".repeat(200));
        let minus_chain = format!("a = {}1", "- ".repeat(500));
        #[rustfmt::skip]
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("   \n\t", "empty"),
            ("-- only a comment\n", "expected an expression"),
            ("a = 1 b", "unexpected"),
            ("a = 1)", "unbalanced"),
            ("(a = 1", "missing ')'"),
            ("((a = 1)", "missing ')'"),
            ("(a = 1 b", "expected ')'"),
            ("a = ", "expected an expression"),
            ("= 1", "expected an expression"),
            ("a = 1 AND", "expected an expression"),
            ("a AND BETWEEN 2 AND 10", "expected an expression"),
            ("a LIKE 'x%'", "unsupported operator LIKE"),
            ("a NOT LIKE 'x%'", "unsupported operator NOT LIKE"),
            ("a CONTAINS 'x'", "unsupported operator CONTAINS"),
            ("a NOT STARTSWITH 'x'", "unsupported operator NOT STARTSWITH"),
            ("a = 1 AND b ENDSWITH 'x'", "unsupported operator ENDSWITH"),
            ("upper(a) = 'X'", "function"),
            ("a = now()", "function"),
            ("a + 1 > 2", "unsupported operator +"),
            ("a * 2 > 2", "unsupported operator *"),
            ("a || 'x' = 'y'", "unsupported operator ||"),
            ("a != 1", "unsupported operator !="),
            ("a == 1", "unsupported operator =="),
            ("a = NULL", "IS NULL"),
            ("NULL <> a", "IS NULL"),
            ("a > 'abc'", "only numbers"),
            ("a > TRUE", "only numbers"),
            ("a > NULL", "only numbers"),
            ("(a = 1) > 2", "condition cannot be compared"),
            ("TRUE = 'x'", "cannot be compared"),
            ("TRUE = 1", "cannot be compared"),
            ("a BETWEEN 10 AND 0", "out of order"),
            ("a BETWEEN NULL AND 5", "NULL"),
            ("a BETWEEN 'a' AND 'b'", "only numbers"),
            ("a IN (1, 2)", "string literals"),
            ("a IN ('x', 2)", "string literals"),
            ("a IN ()", "string literals"),
            ("a IN (SELECT b FROM t)", "string literals"),
            ("'x' IN ('x')", "property on its left"),
            ("a IS TRUE", "only IS NULL"),
            ("a IS DISTINCT FROM b", "only IS NULL"),
            ("a NOT NULL", "unexpected"),
            ("a IS", "only IS NULL"),
            ("a IS NOT TRUE", "only IS NULL"),
            ("a = 1 COLLATE x", "COLLATE"),
            ("a = ANY (SELECT 1)", "quantified"),
            ("5", "boolean"),
            ("'x'", "boolean"),
            ("-a", "boolean"),
            ("NOT 5", "boolean"),
            ("a = 1 AND 5", "boolean"),
            ("a.b = 1", "quote such a name"),
            ("a[1] = 1", "unsupported operator ["),
            ("a = 1 OR", "expected an expression"),
            ("a = 99999999999999999999", "out of range"),
            ("a > 1e400", "greater than"),
            ("a = 007", "leading zeros"),
            ("a > 1.5L", "L suffix"),
            ("a = 'unterminated", "syntax error"),
            ("\"\" = 'x'", "empty property name"),
            ("a = x'AB'", "expected an expression"),
            ("a = ?", "expected an expression"),
            ("a # 1", "unexpected"),
            ("CASE WHEN a = 1 THEN TRUE END", "unexpected"),
            ("a = 1; DROP TABLE t", "unexpected"),
            ("ä = 1", "expected an expression"),
            (&five_kib, "too long"),
            (&deep, "nested too deeply"),
            (&not_chain, "nested too deeply"),
            (&minus_chain, "nested too deeply"),
        ];
        for (expr, want) in cases {
            match SqlFilter::parse(expr) {
                Ok(f) => panic!("{expr:?} parsed: {f:?}"),
                Err(e) => assert!(e.contains(want), "{expr:?}: {e:?} does not mention {want:?}"),
            }
        }
    }

    /// MAX_DEPTH levels of nesting parse, one more does not.
    #[test]
    fn nesting_limits() {
        let n = MAX_DEPTH;
        let ok = [
            format!("{}a = 1{}", "(".repeat(n), ")".repeat(n)),
            format!("{}a", "NOT ".repeat(n)),
            format!("{}(a = 1)", "NOT ".repeat(n - 1)),
            format!("a = {}1", "- ".repeat(n - 1)),
            format!("{}1 = a", "- ".repeat(n - 1)),
        ];
        for expr in &ok {
            SqlFilter::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        }
        let too_deep = [
            format!("{}a = 1{}", "(".repeat(n + 1), ")".repeat(n + 1)),
            format!("{}a", "NOT ".repeat(n + 1)),
            format!("a = {}1", "- ".repeat(n + 1)),
            // operators nested in operators, without parentheses counted
            format!("{}TRUE", "TRUE = ".repeat(n + 1)),
            format!("a{}", " IS NULL".repeat(n + 1)),
        ];
        for expr in &too_deep {
            let e = SqlFilter::parse(expr).unwrap_err();
            assert!(e.contains("nested too deeply"), "{expr}: {e}");
        }
        // A long AND / OR chain is one level.
        let chain = (0..300).map(|i| format!("a='{i}'")).collect::<Vec<_>>().join(" OR ");
        let filter = SqlFilter::parse(&chain).unwrap();
        assert!(filter.matches(lookup(&[("a", "299")]), None));
        assert!(!filter.matches(lookup(&[("a", "300")]), None));
        let chain = (0..300).map(|i| format!("a<>'{i}'")).collect::<Vec<_>>().join(" AND ");
        assert!(SqlFilter::parse(&chain).unwrap().matches(lookup(&[("a", "300")]), None));
    }

    /// The deepest expressions parse (or fail) and evaluate well inside a
    /// quarter of the 2 MiB stack of a Tokio worker or test thread, even
    /// unoptimized.
    #[test]
    fn deepest_expressions_fit_a_small_stack() {
        let n = MAX_DEPTH;
        let worst = [
            format!("{}a = 1{}", "(".repeat(n), ")".repeat(n)),
            format!("{}a", "NOT ".repeat(n)),
            format!("a = {}1", "- ".repeat(n)),
            // every level passes through OR, AND, = and > before its parenthesis
            format!("{}a{}", "a OR b AND c = d > (".repeat(n - 1), ")".repeat(n - 1)),
            format!("{}a = 1{}", "(".repeat(n + 1), ")".repeat(n + 1)),
        ];
        std::thread::Builder::new()
            .stack_size(512 << 10)
            .spawn(move || {
                for expr in &worst {
                    if let Ok(filter) = SqlFilter::parse(expr) {
                        let _ = filter.matches(|_| Some("1"), None);
                    }
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// Random bytes and random token soups never make parse (or evaluation
    /// of what parses) panic.
    #[test]
    fn parse_never_panics() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        #[rustfmt::skip]
        const VOCABULARY: &[&str] = &[
            "a", "b", "TAGS", "\"q.x\"", "1", "-", "+", "2147483648", "3.5", ".5", "1e3", "5L", "'x'", "''", "TRUE",
            "FALSE", "NULL", "NOT", "AND", "OR", "IS", "IN", "BETWEEN", "(", ")", ",", "=", "<>", "<", "<=", ">",
            ">=", "!=", "LIKE", "CONTAINS", "SELECT", "*", "/", ".", "[", "]", "::", "'", "\"", "--", "/*", "*/",
            "\n", "ä", "\u{0}", "ANY", "ALL", "CASE", "f(", "0x1", "$", "#", "?", "@", ";", "IS NOT NULL",
        ];
        let props: Props = &[("a", "1"), ("b", "x"), ("q.x", "2.5")];
        let mut parsed = 0;
        for round in 0..20_000 {
            let len = (next() % 40) as usize;
            let text = if round % 2 == 0 {
                let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            } else {
                (0..len)
                    .map(|_| VOCABULARY[(next() % VOCABULARY.len() as u64) as usize])
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if let Ok(filter) = SqlFilter::parse(&text) {
                parsed += 1;
                let _ = filter.matches(lookup(props), Some("t"));
                let _ = filter.matches(lookup(&[]), None);
            }
        }
        assert!(parsed > 100, "only {parsed} random expressions parsed");
    }

    #[test]
    fn api() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<SqlFilter>();
        let text = "region = 'eu' AND price > 9.5";
        let filter = SqlFilter::parse(text).unwrap();
        assert_eq!(filter.expression(), text);
        assert_eq!(filter.to_string(), text);
        assert_eq!(filter.clone(), SqlFilter::parse(text).unwrap());
        assert_ne!(filter, SqlFilter::parse("region = 'eu'").unwrap());
        // properties from a map
        let props: std::collections::HashMap<String, String> = [
            ("region".to_owned(), "eu".to_owned()),
            ("price".to_owned(), "10".to_owned()),
        ]
        .into();
        assert!(filter.matches(|name| props.get(name).map(String::as_str), None));
        // or from a message's property list
        let list = [("region".to_owned(), "us".to_owned())];
        assert!(!filter.matches(|n| list.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()), None));
    }

    #[test]
    fn java_conversions() {
        assert_eq!(parse_double(" 1.5 "), Ok(1.5));
        assert_eq!(parse_double("1.5d"), Ok(1.5));
        assert_eq!(parse_double("-Infinity"), Ok(f64::NEG_INFINITY));
        assert!(parse_double("NaN").unwrap().is_nan());
        assert_eq!(parse_double("5."), Ok(5.0));
        assert_eq!(parse_double(".5e1"), Ok(5.0));
        for bad in [
            "", "-", "f", "inf", "nan", "NaNd", "1_000", "--1", "1e", "0x1p3", "1.5 x",
        ] {
            assert!(parse_double(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_int("+7"), Ok(7));
        assert!(parse_int("2147483648").is_err());
        assert_eq!(parse_long("2147483648"), Ok(2147483648));
        assert_eq!(java_double_cmp(-0.0, 0.0), Ordering::Less);
        assert_eq!(java_double_cmp(f64::NAN, f64::INFINITY), Ordering::Greater);
        assert_eq!(java_double_cmp(f64::NAN, f64::NAN), Ordering::Equal);
    }
}
