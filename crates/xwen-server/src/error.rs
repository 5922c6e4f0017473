//! Errors in each dialect's shape with the status a client's SDK expects: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` and Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`. A 500 is only ever our own fault.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
}

impl Dialect {
    /// The dialect of a route: Anthropic's under /v1/messages, OpenAI's elsewhere.
    pub fn of_path(path: &str) -> Dialect {
        if path.starts_with("/v1/messages") {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    BadRequest,
    Unauthorized,
    NotFound,
    TooLarge,
    QueueFull,
    Unavailable,
    Internal,
}

#[derive(Debug)]
pub struct ApiError {
    pub dialect: Dialect,
    pub kind: Kind,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(dialect: Dialect, kind: Kind, message: impl Into<String>) -> Self {
        ApiError { dialect, kind, message: message.into(), param: None, code: None }
    }

    pub fn bad(dialect: Dialect, message: impl Into<String>) -> Self {
        Self::new(dialect, Kind::BadRequest, message)
    }

    /// A bad value of request field `param`.
    pub fn param(dialect: Dialect, param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::bad(dialect, message) }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(&self) -> StatusCode {
        match self.kind {
            Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error body (also sent as the last event of a stream that fails).
    pub fn body(&self) -> serde_json::Value {
        match self.dialect {
            Dialect::OpenAi => {
                let t = match self.kind {
                    Kind::BadRequest | Kind::TooLarge => "invalid_request_error",
                    Kind::Unauthorized => "authentication_error",
                    Kind::NotFound => "not_found_error",
                    Kind::QueueFull => "rate_limit_error",
                    Kind::Unavailable => "unavailable_error",
                    Kind::Internal => "server_error",
                };
                json!({"error": {"message": self.message, "type": t, "param": self.param, "code": self.code}})
            }
            Dialect::Anthropic => {
                let t = match self.kind {
                    Kind::BadRequest => "invalid_request_error",
                    Kind::Unauthorized => "authentication_error",
                    Kind::NotFound => "not_found_error",
                    Kind::TooLarge => "request_too_large",
                    Kind::QueueFull => "rate_limit_error",
                    Kind::Unavailable => "overloaded_error",
                    Kind::Internal => "api_error",
                };
                json!({"type": "error", "error": {"type": t, "message": self.message}})
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.body())).into_response();
        if self.kind == Kind::QueueFull {
            // a full queue drains within a reply's time: a client may try again shortly
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}
