//! The state columns' enums: every value a state or status column may hold,
//! as the column holds it. The store owns them because the entities are
//! typed by them (sea-orm's `DeriveActiveEnum`); each area re-exports its
//! own under the name it always had (`deploy::NodeState`,
//! `provider::ProviderStatus`, …).
//!
//! The columns stay text (`db_type = "String(StringLen::None)"`, never a
//! database enum type): a variant is stored as exactly the text it was
//! stored as before the columns were typed. A row whose text names no
//! variant fails the query that reads it; migration 12
//! (`m20261206_000012_state_texts`) refuses to finish on such a row, naming
//! it, so a server never starts on rows it cannot read.

use sea_orm::sea_query::StringLen;

use crate::text::text_enum;

/// [`text_enum!`], plus sea-orm's `DeriveActiveEnum` over a text column:
/// each variant is stored as its text.
macro_rules! state_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident = $text:literal
            ),+ $(,)?
        }
    ) => {
        text_enum! {
            $(#[$meta])*
            #[derive(sea_orm::EnumIter, sea_orm::DeriveActiveEnum)]
            #[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
            $vis enum $name {
                $(
                    $(#[$variant_meta])*
                    #[sea_orm(string_value = $text)]
                    $variant = $text
                ),+
            }
        }
    };
}

state_enum! {
    /// Where a repository's sync is (`repositories.status`).
    pub enum RepositoryStatus {
        New = "NEW",
        Syncing = "SYNCING",
        Active = "ACTIVE",
        Error = "ERROR",
    }
}

state_enum! {
    /// Where an element is in its life (`elements.status`).
    pub enum ElementStatus {
        New = "NEW",
        InProgress = "IN_PROGRESS",
        Active = "ACTIVE",
        Error = "ERROR",
    }
}

state_enum! {
    /// Where a provider's launch is (`providers.status`).
    pub enum ProviderStatus {
        Unloaded = "UNLOADED",
        Fetching = "FETCHING",
        Building = "BUILDING",
        Starting = "STARTING",
        Registering = "REGISTERING",
        Connected = "CONNECTED",
        Disconnected = "DISCONNECTED",
        Failed = "FAILED",
        Unloading = "UNLOADING",
    }
}

state_enum! {
    /// Where a deployment is (`deployments.state`).
    pub enum DeploymentState {
        Pending = "PENDING",
        InProgress = "IN_PROGRESS",
        Complete = "COMPLETE",
        Failed = "FAILED",
        Destroying = "DESTROYING",
        Destroyed = "DESTROYED",
        Suspended = "SUSPENDED",
    }
}

state_enum! {
    /// Where a deployment's resource node is (`deployment_nodes.state`).
    pub enum NodeState {
        ToDeploy = "TO_DEPLOY",
        Waiting = "WAITING",
        InProgress = "IN_PROGRESS",
        Complete = "COMPLETE",
        /// Deployed and powered off or paused (`powerResource`).
        Suspended = "SUSPENDED",
        Failed = "FAILED",
        Tainted = "TAINTED",
        ToDestroy = "TO_DESTROY",
        Destroying = "DESTROYING",
        Destroyed = "DESTROYED",
        /// Deployed, to be updated in place by the apply under way.
        ToUpdate = "TO_UPDATE",
        /// Its `UpdateResource` call is under way.
        Updating = "UPDATING",
        /// Deployed, and going once the apply's creates and updates are
        /// done: replaced by a newer generation, or no longer asked for.
        ToRetire = "TO_RETIRE",
        /// Its `DestroyResource` call, as a retirement, is under way.
        Retiring = "RETIRING",
        /// Retired: its resource is gone; the row goes when the apply ends.
        Retired = "RETIRED",
    }
}

state_enum! {
    /// Whether a plan was applied (`deployment_plans.state`).
    pub enum PlanState {
        Pending = "PENDING",
        Applied = "APPLIED",
    }
}

state_enum! {
    /// The state a deployment event announces (`deployment_events.state`):
    /// a deployment's (a `STATE` event), a node's (a `NODE` event) or a
    /// health (a `HEALTH` event: `deploy::ResourceHealth`, which converts
    /// to it), so every text of [`DeploymentState`], of [`NodeState`] and of
    /// a health, each once.
    pub enum EventState {
        Pending = "PENDING",
        ToDeploy = "TO_DEPLOY",
        Waiting = "WAITING",
        InProgress = "IN_PROGRESS",
        Complete = "COMPLETE",
        Suspended = "SUSPENDED",
        Failed = "FAILED",
        Tainted = "TAINTED",
        ToDestroy = "TO_DESTROY",
        Destroying = "DESTROYING",
        Destroyed = "DESTROYED",
        ToUpdate = "TO_UPDATE",
        Updating = "UPDATING",
        ToRetire = "TO_RETIRE",
        Retiring = "RETIRING",
        Retired = "RETIRED",
        Healthy = "HEALTHY",
        Degraded = "DEGRADED",
        Down = "DOWN",
        Unknown = "UNKNOWN",
    }
}

impl EventState {
    /// The deployment state of the same text, if there is one (a `STATE`
    /// event's state is always one).
    pub fn deployment_state(self) -> Option<DeploymentState> {
        self.as_str().parse().ok()
    }
}

impl From<DeploymentState> for EventState {
    fn from(state: DeploymentState) -> Self {
        match state {
            DeploymentState::Pending => EventState::Pending,
            DeploymentState::InProgress => EventState::InProgress,
            DeploymentState::Complete => EventState::Complete,
            DeploymentState::Failed => EventState::Failed,
            DeploymentState::Destroying => EventState::Destroying,
            DeploymentState::Destroyed => EventState::Destroyed,
            DeploymentState::Suspended => EventState::Suspended,
        }
    }
}

impl From<NodeState> for EventState {
    fn from(state: NodeState) -> Self {
        match state {
            NodeState::ToDeploy => EventState::ToDeploy,
            NodeState::Waiting => EventState::Waiting,
            NodeState::InProgress => EventState::InProgress,
            NodeState::Complete => EventState::Complete,
            NodeState::Suspended => EventState::Suspended,
            NodeState::Failed => EventState::Failed,
            NodeState::Tainted => EventState::Tainted,
            NodeState::ToDestroy => EventState::ToDestroy,
            NodeState::Destroying => EventState::Destroying,
            NodeState::Destroyed => EventState::Destroyed,
            NodeState::ToUpdate => EventState::ToUpdate,
            NodeState::Updating => EventState::Updating,
            NodeState::ToRetire => EventState::ToRetire,
            NodeState::Retiring => EventState::Retiring,
            NodeState::Retired => EventState::Retired,
        }
    }
}

// Sent between replicas in events (`app::feed`).
crate::text::text_serde!(RepositoryStatus, ProviderStatus);

#[cfg(test)]
mod tests {
    use sea_orm::ActiveEnum;

    use super::*;

    /// Each variant is stored as exactly its text, and read back from it.
    fn stored_as_text<E>(all: &[E])
    where
        E: ActiveEnum<Value = String> + Copy + PartialEq + std::fmt::Debug + std::fmt::Display,
    {
        for variant in all {
            assert_eq!(variant.to_value(), variant.to_string());
            assert_eq!(E::try_from_value(&variant.to_string()).ok(), Some(*variant));
        }
        assert!(E::try_from_value(&"NO_SUCH_STATE".to_owned()).is_err());
    }

    #[test]
    fn every_state_is_stored_as_its_text() {
        stored_as_text(&RepositoryStatus::ALL);
        stored_as_text(&ElementStatus::ALL);
        stored_as_text(&ProviderStatus::ALL);
        stored_as_text(&DeploymentState::ALL);
        stored_as_text(&NodeState::ALL);
        stored_as_text(&PlanState::ALL);
        stored_as_text(&EventState::ALL);
    }

    #[test]
    fn an_event_state_is_the_deployment_or_node_state_it_announces() {
        for state in DeploymentState::ALL {
            assert_eq!(EventState::from(state).as_str(), state.as_str());
            assert_eq!(EventState::from(state).deployment_state(), Some(state));
        }
        assert_eq!(EventState::Tainted.deployment_state(), None);
        for state in NodeState::ALL {
            assert_eq!(EventState::from(state).as_str(), state.as_str());
        }
        // Nothing else but the healths (`deploy::ResourceHealth`'s texts,
        // each of which its tests convert).
        let others: Vec<EventState> = EventState::ALL
            .into_iter()
            .filter(|s| {
                s.as_str().parse::<DeploymentState>().is_err()
                    && s.as_str().parse::<NodeState>().is_err()
            })
            .collect();
        assert_eq!(
            others,
            [
                EventState::Healthy,
                EventState::Degraded,
                EventState::Down,
                EventState::Unknown
            ]
        );
    }
}
