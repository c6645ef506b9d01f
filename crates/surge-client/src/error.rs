//! Client errors, each with the errno an application sees.

use surge_proto::{ErrorCode, ErrorReply};
use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum ClientError {
    /// The server refused the request.
    #[error("server {server}: {error}")]
    Remote { server: String, error: ErrorReply },
    /// The server could not be reached or the connection broke.
    #[error("server {server}: {message}")]
    Transport { server: String, message: String },
    /// The server answered with something this client does not expect.
    #[error("server {server}: unexpected reply to {request}: {reply}")]
    Protocol {
        server: String,
        request: &'static str,
        reply: String,
    },
    /// A local error with a chosen errno (e.g. a read past the largest offset).
    #[error("{message}")]
    Local { errno: i32, message: String },
    /// No reply within the client's deadline: the server is stopped, hung or unreachable.
    /// Whether the request was made is unknown.
    #[error(
        "server {server}: no reply to {request} within {after:?} (the server is stopped, hung or \
         unreachable)"
    )]
    Timeout {
        server: String,
        request: &'static str,
        after: std::time::Duration,
    },
    /// The server closed the connection without reading the request (it was idle, see
    /// `ErrorCode::IdleClosed`): the request was not made and may be sent again.
    #[error("server {server}: {message}")]
    Unsent { server: String, message: String },
}

impl ClientError {
    pub fn transport(server: &str, message: String) -> ClientError {
        ClientError::Transport {
            server: server.to_string(),
            message,
        }
    }

    pub fn local(errno: i32, message: impl Into<String>) -> ClientError {
        ClientError::Local {
            errno,
            message: message.into(),
        }
    }

    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Remote { error, .. } => error.code.errno(),
            ClientError::Transport { .. }
            | ClientError::Protocol { .. }
            | ClientError::Timeout { .. }
            | ClientError::Unsent { .. } => libc::EIO,
            ClientError::Local { errno, .. } => *errno,
        }
    }

    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Remote { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
