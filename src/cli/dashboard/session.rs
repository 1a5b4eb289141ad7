//! Logging in: with ACL on, every page calls the cluster signed as the user
//! who logged in with an access key and secret key (ACL 2.0), so the
//! cluster, not the dashboard, decides what that user may see and do.
//!
//! A login is kept by [`super::sessions`]; [`super::guard`] keeps other
//! sites' pages from using it.

use axum::extract::{FromRequestParts, State as AxumState};
use axum::http::{HeaderMap, header, request::Parts};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, extract::Query};
use maud::{Markup, html};
use serde::Deserialize;

use super::caller::{Caller, call, refusal};
use super::page::{self, Flash, Nav};
use super::permissions::Permissions;
use super::sessions::{COOKIE, SESSION_TTL, token};
use super::state::State;
use crate::client::credentials::Credentials;
use crate::proto::pb;

impl FromRequestParts<State> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &State) -> Result<Caller, Self::Rejection> {
        let (who, may) = match token(&parts.headers).and_then(|t| state.sessions.get(t)) {
            Some((who, may)) => (Some(who), may),
            None => (None, Default::default()),
        };
        Ok(Caller {
            namesrv: state.namesrv.clone(),
            who,
            may,
            channels: state.channels.clone(),
        })
    }
}

pub async fn login_page(caller: Caller, Query(flash): Query<Flash>) -> Markup {
    let body = html! {
        h1 { "Log in" }
        p.hint { "With ACL on, the dashboard calls the cluster as the user you log in as: what that user may not do is refused by the cluster, and said here." }
        @if let Some(u) = caller.user() {
            p { "Logged in as " b { (u) } "." }
        }
        form.card method="post" action="/login" {
            label { "Access key" input #access_key name="access_key" required autocomplete="username"; }
            label { "Secret key" input #secret_key name="secret_key" type="password" required autocomplete="current-password"; }
            button #login type="submit" { "Log in" }
        }
    };
    page::shell("Log in", Nav::Login, &caller, &flash, body)
}

#[derive(Deserialize)]
pub struct LoginForm {
    access_key: String,
    secret_key: String,
}

/// Checks the keys with one signed call (a user the cluster does not know,
/// or a wrong secret, is refused as unauthenticated; a known user may still
/// be denied the call itself) and opens a session.
pub async fn login(AxumState(state): AxumState<State>, Form(f): Form<LoginForm>) -> Response {
    let who = Credentials {
        access_key: f.access_key.trim().to_string(),
        secret_key: f.secret_key,
    };
    if who.access_key.is_empty() || who.secret_key.is_empty() {
        return page::back("/login", Err("give an access key and a secret key".into())).into_response();
    }
    let caller = Caller {
        namesrv: state.namesrv.clone(),
        who: Some(who.clone()),
        may: Default::default(),
        channels: state.channels.clone(),
    };
    let check = async {
        let (_, addr) = caller
            .groups()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .ok_or("no broker group is registered with the NameServer")?;
        let mut c = caller.broker(&addr).map_err(|e| e.to_string())?;
        match tokio::time::timeout(
            super::caller::CALL_TIMEOUT,
            c.status(pb::StatusRequest { with_digest: false }),
        )
        .await
        {
            // Known, and allowed or denied this call: the keys are right.
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) if s.code() == tonic::Code::PermissionDenied => Ok(()),
            Ok(Err(s)) if s.code() == tonic::Code::Unauthenticated => {
                Err(format!("wrong access key or secret key ({})", s.message()))
            }
            Ok(Err(s)) => Err(format!("the keys could not be checked: {}", refusal(&s))),
            Err(_) => Err(format!(
                "the broker at {addr} did not answer within {} s",
                super::caller::CALL_TIMEOUT.as_secs()
            )),
        }
    };
    if let Err(e) = check.await {
        return page::back("/login", Err(e)).into_response();
    }
    let may = match &state.own {
        Some(own) => {
            let own = Caller {
                who: Some(own.clone()),
                ..caller.clone()
            };
            permissions(&own, &who.access_key).await
        }
        None => Default::default(),
    };
    let token = state.sessions.open(who.clone(), may);
    let cookie = format!(
        "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SESSION_TTL.as_secs()
    );
    let mut r = page::back("/cluster", Ok(format!("logged in as {}", who.access_key))).into_response();
    if let Ok(v) = cookie.parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

pub async fn logout(AxumState(state): AxumState<State>, headers: HeaderMap) -> Response {
    if let Some(t) = token(&headers) {
        state.sessions.close(t);
    }
    let mut r = Redirect::to("/login").into_response();
    if let Ok(v) = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0").parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `user`'s permissions, read as `own` (the dashboard's keys); Unknown when
/// they cannot be read.
async fn permissions(own: &Caller, user: &str) -> Permissions {
    let Ok(groups) = own.groups().await else {
        return Permissions::Unknown;
    };
    let Some((_, addr)) = groups.first() else {
        return Permissions::Unknown;
    };
    let Ok(mut c) = own.broker(addr) else {
        return Permissions::Unknown;
    };
    match call("read acl", c.read_acl(pb::ReadAclRequest {})).await {
        Ok(r) => super::permissions::of(&r, user),
        Err(_) => Permissions::Unknown,
    }
}
