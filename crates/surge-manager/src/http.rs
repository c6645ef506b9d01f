//! The read-only JSON/HTTP API for scripts and dashboards: `GET /v1/pools`, `/v1/servers`,
//! `/v1/instances`, `/v1/instances/{id}`, `/v1/sessions`, `/v1/stages`. Same JSON as `--json`.
//! `GET /metrics` serves Prometheus metrics ([`crate::metrics`]); `GET /` the web dashboard
//! (`dashboard.html`: one page whose script polls the JSON API every 2 s).
//!
//! Who asks (docs/SECURITY.md): pools, servers and metrics are for anyone, as `sinfo` is;
//! instances, sessions and stage tasks only for a caller who says who they are, with
//! `Authorization: MUNGE <credential>` (`curl -H "Authorization: MUNGE $(munge -n)"`) or
//! `Authorization: Bearer <view token>` (`surge dashboard` prints a URL carrying one), and then
//! only their own (administrators see all), as `squeue` and `dwstat` do with privacy options.

use crate::core::{Core, ManagerError};
use crate::stage::Stages;
use crate::views;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Clone)]
struct AppState {
    core: Arc<Core>,
    stages: Arc<Stages>,
    /// The munged that decodes callers' credentials.
    munge: std::path::PathBuf,
}

enum HttpError {
    Manager(ManagerError),
    /// The request said nothing (or nothing valid) about who sent it.
    Unauthenticated(String),
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let (code, text) = match &self {
            HttpError::Manager(e) => (
                match e {
                    ManagerError::NotFound(_) => StatusCode::NOT_FOUND,
                    ManagerError::Invalid(_) => StatusCode::BAD_REQUEST,
                    ManagerError::Denied(_) => StatusCode::FORBIDDEN,
                    ManagerError::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                },
                e.to_string(),
            ),
            HttpError::Unauthenticated(m) => (StatusCode::UNAUTHORIZED, m.clone()),
        };
        let mut r = (code, Json(json!({ "error": text }))).into_response();
        if code == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"surge\""),
            );
        }
        r
    }
}

impl From<ManagerError> for HttpError {
    fn from(e: ManagerError) -> Self {
        HttpError::Manager(e)
    }
}

/// Who sent `headers`: from `Authorization: MUNGE <credential>` or `Authorization: Bearer
/// <view token>`; refused when neither is there or valid.
async fn viewer(s: &AppState, headers: &HeaderMap) -> Result<surge_auth::Caller, HttpError> {
    const HOW: &str = "say who you are: `Authorization: MUNGE <credential>` (curl -H \
                       \"Authorization: MUNGE $(munge -n)\") or `Authorization: Bearer <token>` \
                       (`surge dashboard` prints a URL with one)";
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Err(HttpError::Unauthenticated(format!(
            "sessions, instances and stage tasks are shown to their owners: {HOW}"
        )));
    };
    let value = value
        .to_str()
        .map_err(|_| HttpError::Unauthenticated(format!("unreadable Authorization: {HOW}")))?;
    let (scheme, cred) = value.trim().split_once(' ').unwrap_or((value, ""));
    match scheme.to_ascii_lowercase().as_str() {
        "munge" => {
            let (cred, socket) = (cred.trim().to_string(), s.munge.clone());
            let decoded =
                tokio::task::spawn_blocking(move || surge_auth::munge::decode(&cred, &socket))
                    .await
                    .map_err(|e| HttpError::Unauthenticated(e.to_string()))?;
            let (uid, gid) = decoded.map_err(|e| HttpError::Unauthenticated(e.to_string()))?;
            Ok(surge_auth::Caller::of(uid, gid))
        }
        "bearer" => {
            let token = surge_auth::Token::from_text(cred.trim())
                .map_err(|e| HttpError::Unauthenticated(format!("bad token: {e}")))?;
            s.core
                .viewer(&token)
                .map_err(|e| HttpError::Unauthenticated(e.to_string()))
        }
        other => Err(HttpError::Unauthenticated(format!(
            "Authorization scheme {other:?} is not known here: {HOW}"
        ))),
    }
}

type HResult = Result<Json<Value>, HttpError>;

async fn pools(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .core
        .pool_usage()
        .await?
        .iter()
        .map(|u| views::pool_json(&views::pool(u)))
        .collect();
    Ok(Json(Value::Array(v)))
}

async fn servers(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .core
        .servers()
        .await?
        .iter()
        .map(|(r, st)| views::server_json(&views::server(r, st.as_ref())))
        .collect();
    Ok(Json(Value::Array(v)))
}

/// `{"servers": [...], "pools": [...]}`: what `surge pool peaks --json` prints.
async fn peaks(State(s): State<AppState>) -> HResult {
    let v = s.core.peaks("").await?;
    Ok(Json(serde_json::json!({
        "servers": v.servers.iter()
            .map(|(r, p)| views::peaks_json(&views::server_peaks(r, p.as_ref())))
            .collect::<Vec<_>>(),
        "pools": v.pools.iter()
            .map(|p| views::peaks_json(&views::pool_peaks(p)))
            .collect::<Vec<_>>(),
    })))
}

async fn instances(State(s): State<AppState>, headers: HeaderMap) -> HResult {
    let c = viewer(&s, &headers).await?;
    let mut v = Vec::new();
    for i in s
        .core
        .instances()
        .await?
        .iter()
        .filter(|i| s.core.may_use(&c, i))
    {
        v.push(views::instance_json(&views::instance(&s.core, i).await));
    }
    Ok(Json(Value::Array(v)))
}

async fn instance(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<u64>) -> HResult {
    let c = viewer(&s, &headers).await?;
    let i = s.core.instance(id, "").await?;
    s.core.check_use(&c, &i)?;
    Ok(Json(views::instance_json(
        &views::instance(&s.core, &i).await,
    )))
}

/// `?before=ID&limit=N&open=1` of a listing: a page, newest first (see the gRPC API's
/// ListSessionsPage); the next page starts below the last id shown.
#[derive(serde::Deserialize, Default)]
struct Page {
    #[serde(default)]
    before: u64,
    #[serde(default)]
    limit: u32,
    #[serde(default)]
    open: u8,
    #[serde(default)]
    session: u64,
}

async fn sessions(State(s): State<AppState>, headers: HeaderMap, Query(p): Query<Page>) -> HResult {
    let c = viewer(&s, &headers).await?;
    let owner = (!s.core.is_admin(&c)).then_some(c.uid);
    let mut v = Vec::new();
    for x in s
        .core
        .sessions_page(p.before, p.limit, p.open != 0, owner)
        .await?
    {
        v.push(views::session_json(&views::session(&s.core, &x).await));
    }
    Ok(Json(Value::Array(v)))
}

async fn list_stages(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(p): Query<Page>,
) -> HResult {
    let c = viewer(&s, &headers).await?;
    let admin = s.core.is_admin(&c);
    if p.session != 0 && !admin && s.core.session(p.session).await?.owner_uid != c.uid {
        return Err(ManagerError::Denied(format!("session {} is not yours", p.session)).into());
    }
    let mut v = Vec::new();
    for t in s.stages.page(p.session, p.before, p.limit).await? {
        // Without a session named, a user sees the tasks of their own sessions.
        if !admin && p.session == 0 {
            match s.core.session(t.session).await {
                Ok(x) if x.owner_uid == c.uid => {}
                _ => continue,
            }
        }
        v.push(views::stage_json(&views::stage(&t)));
    }
    Ok(Json(Value::Array(v)))
}

/// The web dashboard: pools, servers (with a bandwidth plot), instances, sessions, stage tasks.
async fn dashboard() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("dashboard.html"))
}

async fn metrics(State(s): State<AppState>) -> Response {
    match crate::metrics::render(s.core, s.stages).await {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

pub fn router(core: Arc<Core>, stages: Arc<Stages>, munge: std::path::PathBuf) -> Router {
    Router::new()
        .route("/v1/pools", get(pools))
        .route("/v1/servers", get(servers))
        .route("/v1/peaks", get(peaks))
        .route("/v1/instances", get(instances))
        .route("/v1/instances/{id}", get(instance))
        .route("/v1/sessions", get(sessions))
        .route("/v1/stages", get(list_stages))
        .route("/metrics", get(metrics))
        .route("/", get(dashboard))
        .route("/dashboard", get(dashboard))
        .with_state(AppState {
            core,
            stages,
            munge,
        })
}
