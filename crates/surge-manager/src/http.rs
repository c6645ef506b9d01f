//! The read-only JSON/HTTP API for scripts and dashboards: `GET /v1/pools`, `/v1/servers`,
//! `/v1/instances`, `/v1/instances/{id}`, `/v1/sessions`, `/v1/stages`. Same JSON as `--json`.
//! `GET /metrics` serves Prometheus metrics ([`crate::metrics`]); `GET /` the web dashboard
//! (`dashboard.html`: one page whose script polls the JSON API every 2 s).

use crate::core::{Core, ManagerError};
use crate::stage::Stages;
use crate::views;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Clone)]
struct AppState {
    core: Arc<Core>,
    stages: Arc<Stages>,
}

struct HttpError(ManagerError);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let code = match &self.0 {
            ManagerError::NotFound(_) => StatusCode::NOT_FOUND,
            ManagerError::Invalid(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (code, Json(json!({ "error": self.0.to_string() }))).into_response()
    }
}

impl From<ManagerError> for HttpError {
    fn from(e: ManagerError) -> Self {
        HttpError(e)
    }
}

type HResult = Result<Json<Value>, HttpError>;

async fn pools(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .core
        .pool_usage()?
        .iter()
        .map(|u| views::pool_json(&views::pool(u)))
        .collect();
    Ok(Json(Value::Array(v)))
}

async fn servers(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .core
        .servers()?
        .iter()
        .map(|(r, st)| views::server_json(&views::server(r, st.as_ref())))
        .collect();
    Ok(Json(Value::Array(v)))
}

async fn instances(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .core
        .instances()?
        .iter()
        .map(|i| views::instance_json(&views::instance(&s.core, i)))
        .collect();
    Ok(Json(Value::Array(v)))
}

async fn instance(State(s): State<AppState>, Path(id): Path<u64>) -> HResult {
    let i = s.core.instance(id, "")?;
    Ok(Json(views::instance_json(&views::instance(&s.core, &i))))
}

async fn sessions(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .core
        .sessions()?
        .iter()
        .map(|x| views::session_json(&views::session(&s.core, x)))
        .collect();
    Ok(Json(Value::Array(v)))
}

async fn list_stages(State(s): State<AppState>) -> HResult {
    let v: Vec<Value> = s
        .stages
        .list(0)?
        .iter()
        .map(|t| views::stage_json(&views::stage(t)))
        .collect();
    Ok(Json(Value::Array(v)))
}

/// The web dashboard: pools, servers (with a bandwidth plot), instances, sessions, stage tasks.
async fn dashboard() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("dashboard.html"))
}

async fn metrics(State(s): State<AppState>) -> Response {
    match crate::metrics::render(s.core, s.stages) {
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

pub fn router(core: Arc<Core>, stages: Arc<Stages>) -> Router {
    Router::new()
        .route("/v1/pools", get(pools))
        .route("/v1/servers", get(servers))
        .route("/v1/instances", get(instances))
        .route("/v1/instances/{id}", get(instance))
        .route("/v1/sessions", get(sessions))
        .route("/v1/stages", get(list_stages))
        .route("/metrics", get(metrics))
        .route("/", get(dashboard))
        .route("/dashboard", get(dashboard))
        .with_state(AppState { core, stages })
}
