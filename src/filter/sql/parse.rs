//! Parsing an SQL92 filter: sqlparser's tokenizer and precedence loop, with
//! RocketMQ's prefix grammar and operator table supplied through a dialect.

use std::cell::{Cell, RefCell};

use sqlparser::ast::{Expr, Ident, UnaryOperator, Value as SqlValue};
use sqlparser::dialect::Dialect;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use super::tree::{MAX_DEPTH, too_deep};

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

pub(super) fn parse_ast(expr: &str) -> Result<Expr, String> {
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
