//! The states the manager reports as strings on the wire (`Session.state`, `Instance.state`,
//! `StageTask.state`),
//! as enums: a client matches on a variant, and a misspelt state does not compile. The wire
//! keeps the strings (older and newer clients read them); a state this build does not know
//! parses to `None`, which no check mistakes for a known one.

use std::fmt;

macro_rules! states {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $v:ident = $s:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $v,)*
        }

        impl $name {
            /// Every state, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];

            /// The state as the wire and the store spell it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $s,)*
                }
            }

            /// The state a wire string names; `None` for one this build does not know.
            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($s => Some($name::$v),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

states! {
    /// A session's state (`Session.state`).
    SessionState {
        /// Being set up (a crash leaves it so: the next manager ends it as failed).
        Creating = "creating",
        /// Set up; its job runs or will.
        Active = "active",
        /// Ended by its job's teardown.
        Ended = "ended",
        /// Ended after a failure of its job or of a phase.
        Failed = "failed",
        /// Ended because its job was cancelled (`surge bb teardown --hurry`).
        Cancelled = "cancelled",
        /// Ended with its stage-out failed: its instance is kept.
        StageOutFailed = "stage-out-failed",
        /// Its job is gone without a teardown: the `surge run` that made it was killed (the
        /// manager ends it), or Slurm no longer knows the job (`surge bb` reconciles).
        Abandoned = "abandoned",
        /// Ended with a cache instance not drained: its instance is kept.
        DrainPending = "drain-pending",
    }
}

states! {
    /// A stage task's state (`StageTask.state`).
    TaskState {
        /// Waits for a later phase to start it (a cache fill planned at setup).
        Deferred = "deferred",
        /// Waits for a data mover.
        Queued = "queued",
        Running = "running",
        Done = "done",
        Failed = "failed",
        /// Stopped before it finished (its session ended, or asked).
        Cancelled = "cancelled",
    }
}

states! {
    /// An instance's state (`Instance.state`).
    InstanceState {
        /// Its fragments are being made.
        Creating = "creating",
        Active = "active",
        Destroying = "destroying",
        /// Its session or its servers are gone; the collector removes it.
        Orphaned = "orphaned",
    }
}

impl SessionState {
    /// A state a client may end a session in (`EndSession.state`): every ended state but
    /// `DrainPending`, which only the manager decides (a cache instance not yet drained).
    pub fn ends_by_request(self) -> bool {
        matches!(
            self,
            SessionState::Ended
                | SessionState::Failed
                | SessionState::Cancelled
                | SessionState::StageOutFailed
                | SessionState::Abandoned
        )
    }
}

impl TaskState {
    /// Queued or running: it will still move data.
    pub fn in_progress(self) -> bool {
        matches!(self, TaskState::Queued | TaskState::Running)
    }
}

impl crate::v1::Session {
    /// The session's state; `None` for a state this build does not know.
    pub fn session_state(&self) -> Option<SessionState> {
        SessionState::parse(&self.state)
    }

    /// The session is active.
    pub fn is_active(&self) -> bool {
        self.session_state() == Some(SessionState::Active)
    }
}

impl crate::v1::StageTask {
    /// The task's state; `None` for a state this build does not know.
    pub fn task_state(&self) -> Option<TaskState> {
        TaskState::parse(&self.state)
    }

    /// Queued or running.
    pub fn in_progress(&self) -> bool {
        self.task_state().is_some_and(TaskState::in_progress)
    }

    /// Running now.
    pub fn is_running(&self) -> bool {
        self.task_state() == Some(TaskState::Running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_wire_string() {
        for s in SessionState::ALL {
            assert_eq!(SessionState::parse(s.as_str()), Some(*s));
        }
        for i in InstanceState::ALL {
            assert_eq!(InstanceState::parse(i.as_str()), Some(*i));
        }
        for t in TaskState::ALL {
            assert_eq!(TaskState::parse(t.as_str()), Some(*t));
        }
        assert_eq!(SessionState::parse("Active"), None, "spelt exactly");
        assert_eq!(TaskState::parse("finished"), None);
    }

    #[test]
    fn only_queued_and_running_tasks_are_in_progress() {
        let going: Vec<&str> = TaskState::ALL
            .iter()
            .filter(|t| t.in_progress())
            .map(|t| t.as_str())
            .collect();
        assert_eq!(going, ["queued", "running"]);
        let unknown = crate::v1::StageTask {
            state: "paused".into(),
            ..Default::default()
        };
        assert!(!unknown.in_progress() && !unknown.is_running());
    }
}
