//! The page shell every page shares: navigation, who is logged in, the
//! outcome of the last change, the style sheet, and the script that keeps
//! the parts marked `data-live` fresh (it fetches the page again and swaps
//! those elements by id, so forms and scroll stay put). Also: links with
//! their query strings, redirects that carry an outcome, and how numbers,
//! sizes and times are shown.

use axum::response::Redirect;
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;

use super::caller::Caller;

/// How often live parts refresh, in milliseconds.
pub const REFRESH_MS: u64 = 2000;

/// The page a link of the navigation names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Cluster,
    Topics,
    Groups,
    Messages,
    Charts,
    Login,
}

const NAV: [(Nav, &str, &str); 5] = [
    (Nav::Cluster, "/cluster", "Cluster"),
    (Nav::Topics, "/topics", "Topics"),
    (Nav::Groups, "/groups", "Consumer groups"),
    (Nav::Messages, "/messages", "Messages"),
    (Nav::Charts, "/charts", "Charts"),
];

/// The outcome of the change that redirected here (`?ok=` or `?error=`).
#[derive(Debug, Default, Deserialize)]
pub struct Flash {
    pub ok: Option<String>,
    pub error: Option<String>,
}

/// `path` with `query` encoded.
pub fn link(path: &str, query: &[(&str, &str)]) -> String {
    match serde_urlencoded::to_string(query) {
        Ok(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_string(),
    }
}

/// A redirect to `path` (which may carry a query already) with the outcome
/// of a change.
pub fn back(path: &str, outcome: Result<String, String>) -> Redirect {
    let (k, v) = match &outcome {
        Ok(m) => ("ok", m.as_str()),
        Err(m) => ("error", m.as_str()),
    };
    let q = serde_urlencoded::to_string([(k, v)]).unwrap_or_default();
    let sep = if path.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{path}{sep}{q}"))
}

/// Bytes as people read them: `512 B`, `1.5 KiB`, `64.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A store time, or a dash for none.
pub fn time(ms: u64) -> String {
    if ms == 0 {
        "-".into()
    } else {
        crate::cli::display::local_time(ms)
    }
}

/// A time a form gives as milliseconds since the epoch: a local date-time
/// (`2026-12-04T21:30`, as `datetime-local` inputs send it), milliseconds
/// since the epoch, or an age (`10m`).
pub fn instant_of(at: &str) -> Result<u64, String> {
    use chrono::TimeZone;
    let at = at.trim();
    if let Ok(t) = chrono::NaiveDateTime::parse_from_str(at, "%Y-%m-%dT%H:%M")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(at, "%Y-%m-%dT%H:%M:%S"))
    {
        return chrono::Local
            .from_local_datetime(&t)
            .earliest()
            .map(|t| t.timestamp_millis().max(0) as u64)
            .ok_or_else(|| format!("{at} does not exist in this time zone"));
    }
    crate::cli::group::timestamp_of("time", at).map_err(|e| e.to_string())
}

/// `?name=`: the topic or group a detail page is about.
#[derive(Debug, Deserialize)]
pub struct Named {
    pub name: String,
}

/// A page body, or what kept it from being made as a red box.
pub fn or_error(body: Result<Markup, String>) -> Markup {
    body.unwrap_or_else(|e| error_box(&e))
}

/// Any error as a red box.
pub fn error_box(e: &str) -> Markup {
    html! { p.error { (e) } }
}

/// The whole page around `body`.
pub fn shell(title: &str, active: Nav, caller: &Caller, flash: &Flash, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · raftmq" }
                link rel="stylesheet" href="/style.css";
            }
            body data-refresh=(REFRESH_MS) {
                header {
                    a.brand href="/cluster" { "raftmq" }
                    nav {
                        @for (nav, href, label) in NAV {
                            a href=(href) class=[(nav == active).then_some("active")] { (label) }
                        }
                    }
                    div.who {
                        @match caller.user() {
                            Some(u) => {
                                span { "user " b #user { (u) } }
                                form method="post" action="/logout" { button.link type="submit" { "Log out" } }
                            }
                            None => { a href="/login" class=[(active == Nav::Login).then_some("active")] { "Log in" } }
                        }
                    }
                }
                main {
                    @if let Some(m) = &flash.ok { p.ok #flash-ok { (m) } }
                    @if let Some(m) = &flash.error { p.error #flash-error { (m) } }
                    (body)
                }
                footer { "NameServer " (caller.namesrv) " · updated " span #updated { "now" } }
                script src="/live.js" {}
            }
        }
    }
}

/// `/live.js`: the only script (served, not inline, so the page's
/// Content-Security-Policy can forbid inline scripts).
pub async fn script() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

/// `/style.css`.
pub async fn style() -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

/// Refreshes the `data-live` elements (by id) from a new copy of the page,
/// every `data-refresh` ms; drops `ok`/`error` from the address so that a
/// reload does not show an old outcome again.
const SCRIPT: &str = r#"
(function () {
  const url = new URL(location.href);
  if (url.searchParams.has('ok') || url.searchParams.has('error')) {
    url.searchParams.delete('ok'); url.searchParams.delete('error');
    history.replaceState(null, '', url);
  }
  if (!document.querySelector('[data-live]')) return;
  const every = Number(document.body.dataset.refresh) || 2000;
  async function tick() {
    try {
      const r = await fetch(location.href, { headers: { 'x-live': '1' }, credentials: 'same-origin' });
      if (r.ok) {
        const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
        for (const el of document.querySelectorAll('[data-live]')) {
          const fresh = doc.getElementById(el.id);
          if (fresh) el.replaceWith(fresh);
        }
        document.getElementById('updated').textContent = new Date().toLocaleTimeString();
      }
    } catch (e) { /* the next tick tries again */ }
    setTimeout(tick, every);
  }
  setTimeout(tick, every);
})();
"#;

const STYLE: &str = r#"
:root { --ink: #1d2433; --muted: #6b7385; --line: #e3e6ec; --bg: #f5f6f8; --accent: #2f6fed;
        --ok: #1f8a4c; --warn: #b7791f; --bad: #c53030; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: var(--bg); }
header { display: flex; align-items: center; gap: 24px; padding: 0 24px; height: 52px; background: #161b26; color: #fff; }
header a { color: #c9d1e0; text-decoration: none; padding: 6px 10px; border-radius: 6px; }
header a.active, header a:hover { background: #2a3244; color: #fff; }
header .brand { font-weight: 700; font-size: 17px; color: #fff; letter-spacing: .3px; }
header nav { display: flex; gap: 4px; flex: 1; }
header .who { display: flex; align-items: center; gap: 10px; color: #c9d1e0; }
header .who form { margin: 0; }
button.link { background: none; border: 0; color: #c9d1e0; cursor: pointer; padding: 6px 10px; font: inherit; }
main { padding: 20px 24px 40px; max-width: 1400px; }
h1 { font-size: 22px; margin: 4px 0 14px; }
h2 { font-size: 16px; margin: 22px 0 10px; }
h2 small, h1 small { color: var(--muted); font-weight: 400; font-size: 13px; }
.hint { color: var(--muted); }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); border-radius: 8px; overflow: hidden; }
th, td { text-align: left; padding: 7px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { background: #fafbfc; color: var(--muted); font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .4px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:last-child td { border-bottom: 0; }
td.wrap { white-space: normal; word-break: break-all; }
a { color: var(--accent); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; background: #e8ecf3; color: var(--ink); }
.badge.leader { background: #dcf3e4; color: var(--ok); }
.badge.follower { background: #e3ecfd; color: var(--accent); }
.badge.candidate, .badge.learner { background: #fbefd9; color: var(--warn); }
.badge.unreachable, .badge.bad { background: #fde2e2; color: var(--bad); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 12px; margin-bottom: 8px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .4px; }
.card .v { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.group { margin-bottom: 18px; }
form.card { display: flex; flex-wrap: wrap; gap: 10px 14px; align-items: flex-end; margin: 10px 0; }
form.inline { display: inline; margin: 0; }
label { display: flex; flex-direction: column; gap: 3px; font-size: 12px; color: var(--muted); }
input, select, textarea { font: inherit; padding: 6px 8px; border: 1px solid #cfd4dd; border-radius: 6px; background: #fff; color: var(--ink); }
textarea { min-width: 320px; min-height: 60px; }
button { font: inherit; padding: 6px 14px; border-radius: 6px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; }
button.danger { background: #fff; color: var(--bad); border-color: #e7b4b4; }
p.ok, p.error { padding: 9px 12px; border-radius: 6px; margin: 0 0 14px; }
p.ok { background: #dcf3e4; color: #16603a; }
p.error { background: #fde2e2; color: #8c1d1d; white-space: pre-wrap; }
pre { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; overflow: auto; max-height: 420px; }
.chart { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px; margin-bottom: 14px; }
.chart svg { width: 100%; height: auto; }
.bar { height: 8px; background: #e8ecf3; border-radius: 4px; min-width: 80px; overflow: hidden; }
.bar span { display: block; height: 100%; background: var(--accent); }
.bar.hot span { background: var(--bad); }
footer { color: var(--muted); font-size: 12px; padding: 0 24px 20px; }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_encode_topic_names() {
        assert_eq!(link("/topic", &[("name", "%DLQ%g|x")]), "/topic?name=%25DLQ%25g%7Cx");
        assert_eq!(link("/topics", &[]), "/topics");
    }

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(64 << 20), "64.0 MiB");
    }
}
