//! A subscription's filter, as a receive or a pull names it: RocketMQ's tag
//! expression (`*`, or tags joined by `||`) or an SQL92 expression over the
//! message's user properties and its tag (see [`crate::filter::sql`]).
//!
//! Checking goes in two steps, as in RocketMQ: the ConsumeQueue unit's tag
//! hash rules a message out cheaply ([`Filter::may_match`]), and only then
//! is the message itself read when the filter needs it
//! ([`Filter::needs_message`], [`Filter::matches`]): equal hashes may hide
//! different tags, and SQL needs the properties.

pub mod sql;

use raftmq_raft::message::{MessageView, tag_hash};

use crate::error::BrokerError;
use crate::filter::sql::SqlFilter;
use crate::proto::rocketmq::v2::{self, Code};

/// Longest tag expression accepted, in bytes (as long as an SQL92 one).
pub const MAX_TAG_EXPRESSION_LEN: usize = crate::filter::sql::MAX_EXPRESSION_LEN;
/// Most tags one expression may name: each unit of a queue is checked
/// against all of them.
pub const MAX_TAGS: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    All,
    /// Tags and their hashes (the ConsumeQueue holds the hash).
    Tags(Vec<(String, u64)>),
    Sql(SqlFilter),
}

impl Filter {
    /// The filter of a v2 request: none means every message. A bad
    /// expression is refused here, at subscription, with the parser's
    /// reason.
    pub fn of_v2(f: Option<&v2::FilterExpression>) -> Result<Filter, BrokerError> {
        match f {
            None => Ok(Filter::All),
            Some(f) => match v2::FilterType::try_from(f.r#type).unwrap_or(v2::FilterType::Unspecified) {
                v2::FilterType::Tag | v2::FilterType::Unspecified => Filter::tags(&f.expression),
                v2::FilterType::Sql => Filter::sql(&f.expression),
            },
        }
    }

    /// Parses RocketMQ's tag expression: `*` (or empty) for all, or tags
    /// separated by `||`.
    pub fn tags(expr: &str) -> Result<Filter, BrokerError> {
        if expr.len() > MAX_TAG_EXPRESSION_LEN {
            return Err(BrokerError::Refused(
                Code::IllegalFilterExpression,
                format!(
                    "tag expression of {} bytes: at most {MAX_TAG_EXPRESSION_LEN}",
                    expr.len()
                ),
            ));
        }
        let expr = expr.trim();
        if expr.is_empty() || expr == "*" {
            return Ok(Filter::All);
        }
        let mut tags = Vec::new();
        for t in expr.split("||") {
            let t = t.trim();
            if t.is_empty() {
                return Err(BrokerError::Refused(
                    Code::IllegalFilterExpression,
                    format!("tag expression {expr:?} has an empty tag"),
                ));
            }
            if t == "*" {
                return Ok(Filter::All);
            }
            if tags.len() == MAX_TAGS {
                return Err(BrokerError::Refused(
                    Code::IllegalFilterExpression,
                    format!("tag expression names more than {MAX_TAGS} tags"),
                ));
            }
            tags.push((t.to_string(), tag_hash(t)));
        }
        Ok(Filter::Tags(tags))
    }

    /// The filter of a subscription as clients list it (`"SQL"` or a tag
    /// expression), in the form two subscriptions that filter alike share:
    /// tags sorted and named once, SQL parsed (so spacing and case of
    /// keywords do not count). `None` when the expression does not parse.
    pub fn canonical(expression_type: &str, expression: &str) -> Option<Filter> {
        let f = match expression_type {
            "SQL" | "SQL92" => Filter::sql(expression),
            _ => Filter::tags(expression),
        };
        match f.ok()? {
            Filter::Tags(mut tags) => {
                tags.sort();
                tags.dedup();
                Some(Filter::Tags(tags))
            }
            f => Some(f),
        }
    }

    pub fn sql(expr: &str) -> Result<Filter, BrokerError> {
        SqlFilter::parse(expr)
            .map(Filter::Sql)
            .map_err(|e| BrokerError::Refused(Code::IllegalFilterExpression, format!("SQL92 filter {expr:?}: {e}")))
    }

    /// Whether a message whose ConsumeQueue unit has this tag hash may
    /// match.
    pub fn may_match(&self, hash: u64) -> bool {
        match self {
            Filter::All | Filter::Sql(_) => true,
            Filter::Tags(t) => t.iter().any(|(_, h)| *h == hash),
        }
    }

    /// Whether [`Filter::matches`] must see the message itself.
    pub fn needs_message(&self) -> bool {
        !matches!(self, Filter::All)
    }

    /// Whether the message matches.
    pub fn matches(&self, view: &MessageView<'_>) -> bool {
        match self {
            Filter::All => true,
            Filter::Tags(t) => t.iter().any(|(s, _)| s == view.tag),
            Filter::Sql(sql) => {
                let properties = view.properties();
                let tag = (!view.tag.is_empty()).then_some(view.tag);
                sql.matches(
                    |name: &str| properties.iter().find(|(k, _)| *k == name).map(|(_, v)| *v),
                    tag,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql_expr(expr: &str) -> v2::FilterExpression {
        v2::FilterExpression {
            r#type: v2::FilterType::Sql as i32,
            expression: expr.into(),
        }
    }

    #[test]
    fn tag_expressions() {
        assert_eq!(Filter::tags("*").unwrap(), Filter::All);
        assert_eq!(Filter::tags(" ").unwrap(), Filter::All);
        let f = Filter::tags("a || b").unwrap();
        assert!(f.may_match(tag_hash("a")) && !f.may_match(tag_hash("c")));
        assert!(Filter::tags("a || ").is_err());
        // Bounded: a huge expression or too many tags is refused up front.
        let huge = "a".repeat(MAX_TAG_EXPRESSION_LEN + 1);
        assert_eq!(
            Filter::tags(&huge).unwrap_err().v2_code(),
            Code::IllegalFilterExpression
        );
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert!(Filter::tags(&many.join("||")).is_err());
        assert!(Filter::tags(&many[..MAX_TAGS].join("||")).is_ok());
        assert_eq!(Filter::of_v2(None).unwrap(), Filter::All);
    }

    #[test]
    fn subscriptions_that_filter_alike_compare_equal() {
        let c = Filter::canonical;
        assert_eq!(c("TAG", "b || a"), c("TAG", "a||b||a"));
        assert_eq!(c("TAG", "*"), c("TAG", ""));
        assert_ne!(c("TAG", "a"), c("TAG", "a || b"));
        assert_eq!(c("SQL", "a > 5 AND b = 'x'"), c("SQL", "a>5  and b='x'"));
        assert_ne!(c("SQL", "b = 'x'"), c("SQL", "b = 'x '"));
        assert_eq!(c("SQL", "a LIKE"), None);
    }

    #[test]
    fn sql_expressions_are_checked_at_subscription() {
        let f = Filter::of_v2(Some(&sql_expr("a > 5 AND TAGS IN ('x', 'y')"))).unwrap();
        assert!(matches!(f, Filter::Sql(_)) && f.needs_message() && f.may_match(0));
        let e = Filter::of_v2(Some(&sql_expr("a LIKE 'x%'"))).unwrap_err();
        assert_eq!(e.v2_code(), Code::IllegalFilterExpression);
        assert!(e.to_string().contains("LIKE"), "{e}");
    }
}
