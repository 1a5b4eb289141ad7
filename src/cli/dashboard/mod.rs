//! `raftmq dashboard`: a web console for operators, RocketMQ Dashboard's
//! main pages for raftmq. Server-rendered HTML (axum and maud) with one
//! small script that refreshes the live parts of a page; nothing is fetched
//! from the internet, so it works offline. It reads and changes the cluster
//! only through the protocols the CLI uses (the NameServers and
//! `raftmq.v1.Broker`), as the user logged in: there is no second source of
//! truth.
//!
//! | module       | the room for                                                        |
//! |--------------|---------------------------------------------------------------------|
//! | [`caller`]   | who a page calls as, the calls every page makes, refusals explained  |
//! | [`state`]    | what every request handler shares                                   |
//! | [`guard`]    | the Host allowlist, the same-origin rule for changes, framing and script policy |
//! | [`session`]  | logging in and out (ACL 2.0 keys), the caller of a request, the same-origin guard |
//! | [`sessions`] | the logins kept, by cookie token                                    |
//! | [`page`]     | the page shell (navigation, style, the refresh script), links, flashes |
//! | [`cluster`]  | `/cluster`: groups, nodes, roles, indexes, heartbeats, store and disk |
//! | [`topics`]   | `/topics`, `/topic`: queues, offsets; create, update, delete, send   |
//! | [`groups`]   | `/groups`, `/group`: lag, in-flight, rates, connections; reset offsets |
//! | [`messages`] | `/messages`, `/message`: by id, key or time; dead letters resent     |
//! | [`charts`]   | `/charts`: messages in and out per second and lag, as SVG             |
//! | [`permissions`] | what the user logged in may do, read from the ACL: what pages offer |
//! | [`sampler`]  | the background reading of rates and lag the charts and groups show  |
//!
//! Every change is a POST of a form from the dashboard's own pages, answered
//! with a redirect that carries its outcome (`?ok=` or `?error=`).

pub mod caller;
pub mod charts;
pub mod cluster;
pub mod groups;
pub mod guard;
pub mod messages;
pub mod page;
pub mod permissions;
pub mod sampler;
pub mod session;
pub mod sessions;
pub mod state;
pub mod topics;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

/// The dashboard's default address: RocketMQ Dashboard's port, on loopback
/// (the dashboard can change the cluster; expose it deliberately).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

#[derive(Debug, clap::Args)]
pub struct DashboardArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    pub namesrv: String,
    /// Address to serve the dashboard on (plain HTTP: keep it on loopback,
    /// or put a TLS proxy in front).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// A further host name the dashboard answers to (`name` or
    /// `name:port`), as a proxy or a published port names it; repeatable.
    /// Other names are refused (DNS rebinding).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// How often the charts sample the nodes, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(200..=60_000))]
    pub sample_ms: u64,
}

/// `raftmq dashboard`: serves until Ctrl-C or SIGTERM.
pub async fn run(a: DashboardArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", a.listen))?;
    let at = listener.local_addr()?;
    println!("raftmq dashboard on http://{at}/ (NameServer {})", a.namesrv);
    if !at.ip().is_loopback() {
        eprintln!(
            "warning: the dashboard speaks plain HTTP on {at}: logins cross the network unencrypted; \
             put a TLS proxy in front, or keep it on 127.0.0.1"
        );
    }
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    let opts = Options {
        namesrv: a.namesrv,
        allowed_hosts: a.allowed_hosts,
        sample_every: Duration::from_millis(a.sample_ms),
    };
    serve(listener, opts, stop).await
}

/// What [`serve`] needs besides its listener.
pub struct Options {
    pub namesrv: String,
    /// Host names to answer to besides the loopback ones ([`guard::Hosts`]).
    pub allowed_hosts: Vec<String>,
    pub sample_every: Duration,
}

/// Requests served at once; more wait (every page fans out to the nodes).
const MAX_IN_FLIGHT: usize = 64;

/// Serves the dashboard on `listener` until `stop` completes; the charts'
/// sampler runs as long, signing with the keys this process was given.
pub async fn serve(
    listener: tokio::net::TcpListener,
    o: Options,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let hosts = Arc::new(guard::Hosts::new(listener.local_addr()?, &o.allowed_hosts));
    let channels = Arc::new(caller::Channels::default());
    let own = crate::cli::connect::credentials();
    let state = Arc::new(state::Dashboard {
        namesrv: o.namesrv.clone(),
        sessions: sessions::Sessions::default(),
        charts: Arc::new(sampler::Charts::default()),
        channels: channels.clone(),
        own: own.clone(),
    });
    let sampler_caller = caller::Caller {
        namesrv: o.namesrv,
        who: own,
        may: Default::default(),
        channels,
    };
    let sampler = tokio::spawn(sampler::sample(state.charts.clone(), sampler_caller, o.sample_every));
    let out = axum::serve(listener, router(state, hosts))
        .with_graceful_shutdown(stop)
        .await;
    sampler.abort();
    out.map_err(|e| anyhow::anyhow!("dashboard: {e}"))
}

fn router(state: state::State, hosts: Arc<guard::Hosts>) -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/cluster") }))
        .route("/cluster", get(cluster::page))
        .route("/topics", get(topics::list).post(topics::create))
        .route("/topic", get(topics::detail))
        .route("/topic/update", post(topics::update))
        .route("/topic/delete", post(topics::delete))
        .route("/topic/send", post(topics::send))
        .route("/groups", get(groups::list).post(groups::create))
        .route("/group", get(groups::detail))
        .route("/group/update", post(groups::update))
        .route("/group/delete", post(groups::delete))
        .route("/group/reset", post(groups::reset))
        .route("/messages", get(messages::search))
        .route("/message", get(messages::view))
        .route("/message/resend", post(messages::resend))
        .route("/charts", get(charts::page))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", post(session::logout))
        .route("/live.js", get(page::script))
        .route("/style.css", get(page::style))
        .layer(axum::middleware::from_fn_with_state(hosts, guard::guard))
        .layer(tower::limit::ConcurrencyLimitLayer::new(MAX_IN_FLIGHT))
        // Forms are small; nothing larger is taken.
        .layer(axum::extract::DefaultBodyLimit::max(1 << 20))
        .with_state(state)
}
