//! The provider host as a source of repositories: `GetInventory` and
//! `GetElement` through the link, converted to the inventory format here so the
//! repository area never sees protocol types.
//!
//! It never finds or checks the link itself: `calls` hands over a connected
//! provider's link, refused without the `repository` feature.

use tokio::sync::mpsc;
use uuid::Uuid;

use super::Providers;
use crate::repository::driver::{ProviderSource, SourcedEntry};

#[async_trait::async_trait]
impl ProviderSource for Providers {
    async fn inventory(
        &self,
        provider_id: Uuid,
        out: mpsc::Sender<SourcedEntry>,
    ) -> Result<(), String> {
        let link = self.inner.calls.repository_link(provider_id).await?;
        let mut stream = link.get_inventory().await.map_err(|e| e.to_string())?;
        while let Some(entry) = link
            .next("GetInventory", &mut stream)
            .await
            .map_err(|e| e.to_string())?
        {
            let index: serde_json::Map<String, serde_json::Value> = entry
                .index
                .into_iter()
                .map(|(category, files)| {
                    let files: serde_json::Map<String, serde_json::Value> = files
                        .files
                        .into_iter()
                        .map(|(id, file)| (id, serde_json::Value::String(file)))
                        .collect();
                    (category, serde_json::Value::Object(files))
                })
                .collect();
            let json = serde_json::json!({ "index": index }).to_string();
            let sourced = SourcedEntry {
                name: entry.name,
                version: entry.version,
                json,
            };
            if out.send(sourced).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    async fn manifest(
        &self,
        provider_id: Uuid,
        name: &str,
        version: &str,
    ) -> Result<String, String> {
        let link = self.inner.calls.repository_link(provider_id).await?;
        link.get_element(name, version)
            .await
            .map(|r| r.manifest_yaml)
            .map_err(|e| e.to_string())
    }
}
