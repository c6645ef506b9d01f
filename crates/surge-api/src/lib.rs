//! The control plane's gRPC API: what the CLI, `surge run` and servers use to talk to
//! `surge manager`. Generated from `proto/surge.proto`; see that file for the meaning of each
//! call. Bulk data never goes through this API (DESIGN §3).

pub mod v1 {
    tonic::include_proto!("surge.v1");
}
