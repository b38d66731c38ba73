//! Installations: an installed element's blueprint runs as a deployment owned
//! by the platform. The deploy area implements [`Installations`]; this area
//! only asks for an installation to be made or destroyed, and waits.

use std::sync::Arc;

use uuid::Uuid;

#[async_trait::async_trait]
pub trait Installations: Send + Sync {
    /// Checks a manifest's `resources` as a blueprint; the error names the
    /// resource key and field.
    fn check(&self, label: &str, resources: &serde_json::Value) -> Result<(), String>;

    /// Deploys `resources` as the installation of `element_id` and waits until
    /// it is complete. `None` when there is nothing to deploy.
    async fn deploy(
        &self,
        element_id: Uuid,
        label: &str,
        resources: &serde_json::Value,
    ) -> Result<Option<Uuid>, String>;

    /// Destroys the installation of `element_id`, if it has one, and waits.
    async fn destroy(&self, element_id: Uuid) -> Result<(), String>;
}

/// The deploy area's handle, when this server has one.
#[derive(Clone, Default)]
pub struct InstallationsHandle(pub Option<Arc<dyn Installations>>);

impl std::fmt::Debug for InstallationsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Installations(deploying)"
        } else {
            "Installations(recording only)"
        })
    }
}
