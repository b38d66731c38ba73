//! The deploy engine's enums as the API shows them: each mirrors its domain
//! enum variant by variant (`mirror_enum!`), converted both ways by an
//! exhaustive `match`, so a new variant fails to compile until the API names it.

use async_graphql::Enum;

use crate::deploy as domain;
use crate::deploy::strategy::Strategy;

macro_rules! mirror_enum {
    ($name:ident, $domain:path { $($variant:ident),+ $(,)? }) => {
        #[derive(Enum, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }

        impl From<$domain> for $name {
            fn from(s: $domain) -> Self {
                use $domain as D;
                match s { $(D::$variant => $name::$variant),+ }
            }
        }

        impl From<$name> for $domain {
            fn from(s: $name) -> Self {
                use $domain as D;
                match s { $($name::$variant => D::$variant),+ }
            }
        }
    };
}

mirror_enum!(
    DeploymentState,
    domain::DeploymentState {
        Pending,
        InProgress,
        Complete,
        Failed,
        Destroying,
        Destroyed,
        Suspended
    }
);
mirror_enum!(
    DeploymentPhase,
    domain::Phase {
        Deploy,
        Rollback,
        Destroy,
        Apply,
        Restart
    }
);
mirror_enum!(
    NodeState,
    domain::NodeState {
        ToDeploy,
        Waiting,
        InProgress,
        Complete,
        Suspended,
        Failed,
        Tainted,
        ToDestroy,
        Destroying,
        Destroyed,
        ToUpdate,
        Updating,
        ToRetire,
        Retiring,
        Retired
    }
);
mirror_enum!(OnFailure, domain::OnFailure { Rollback, Keep });
mirror_enum!(
    PowerAction,
    crate::provider::PowerAction {
        Start,
        Stop,
        Restart,
        Pause,
        Resume
    }
);
mirror_enum!(
    PlacementStrategy,
    Strategy {
        Auto,
        Fill,
        Each,
        Global,
        Drained
    }
);
mirror_enum!(
    DeploymentEventKind,
    domain::EventKind {
        State,
        Node,
        Progress,
        Log,
        Health
    }
);
mirror_enum!(
    ResourceHealth,
    domain::ResourceHealth {
        Healthy,
        Degraded,
        Down,
        Unknown
    }
);
