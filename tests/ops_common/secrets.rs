//! The secrets of the redaction tests: a RabbitMQ user of the test's own with a password that must never
//! be logged, a license key, a VNC password, and a submission that carries the last two into the job.
#![allow(dead_code)]

use volcano_runner::config::{Config, LicenseServer, Secret};
use volcano_runner::messages::v1::SubmitJob;

use super::rabbit::{AMQP_ADDR, TestVhost, management, segment};

/// Distinct, unguessable-looking values, so that finding one in a log can only mean it leaked.
pub struct Secrets {
    /// The AMQP password as the URL carries it (percent-encoded: it contains `@` and `/`).
    pub amqp_password_encoded: String,
    /// The same password, decoded.
    pub amqp_password: String,
    pub license_key: String,
    pub vnc_password: String,
}

impl Secrets {
    pub fn new(label: &str) -> Self {
        let nonce = format!(
            "{:x}{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        Self {
            amqp_password: format!("Pw@{label}/{nonce}-Amqp"),
            amqp_password_encoded: format!("Pw%40{label}%2F{nonce}-Amqp"),
            license_key: format!("LIC-{nonce}-{label}-KEY"),
            vnc_password: format!("Vnc\"{nonce}\\{label}"),
        }
    }

    /// Every form a leak could take that a reader would recognise.
    pub fn forms(&self) -> Vec<(&'static str, String)> {
        let inner = |s: &str| {
            let json = serde_json::Value::String(s.to_owned()).to_string();
            json[1..json.len() - 1].to_owned()
        };
        vec![
            ("AMQP password", self.amqp_password.clone()),
            (
                "AMQP password (URL form)",
                self.amqp_password_encoded.clone(),
            ),
            ("license key", self.license_key.clone()),
            ("VNC password", self.vnc_password.clone()),
            ("VNC password (escaped)", inner(&self.vnc_password)),
            (
                "VNC password (escaped twice)",
                inner(&inner(&self.vnc_password)),
            ),
            // The distinctive middle of each, in case a secret is logged cut or re-encoded around it.
            (
                "AMQP password nonce part",
                self.amqp_password.split('/').nth(1).unwrap().to_owned(),
            ),
            ("license key nonce part", self.license_key[4..].to_owned()),
        ]
    }

    /// Which of the secrets' forms occur in `text`.
    pub fn found_in(&self, text: &str) -> Vec<&'static str> {
        self.forms()
            .into_iter()
            .filter(|(_, form)| text.contains(form.as_str()))
            .map(|(what, _)| what)
            .collect()
    }

    /// The AMQP URL of `user` on the vhost.
    pub fn amqp_url(&self, user: &str, vhost: &TestVhost) -> String {
        format!(
            "amqp://{user}:{}@{AMQP_ADDR}/{}",
            self.amqp_password_encoded,
            segment(&vhost.name)
        )
    }

    /// Puts the AMQP URL and the license server into a configuration.
    pub fn configure(&self, config: &mut Config, amqp_url: &str) {
        config.broker.url = Secret::new(amqp_url.to_owned());
        config.licenses.insert(
            "matlab-campus".into(),
            LicenseServer {
                address: "license.cloud.sdu.dk".into(),
                port: 27000,
                license: Some(Secret::new(self.license_key.clone())),
            },
        );
    }

    /// A VNC application that runs `sleep <seconds>` with the license server in its environment and
    /// the VNC password set.
    pub fn job(&self, job_id: &str, seconds: u64) -> SubmitJob {
        let mut job = super::fleet::sleeping_job(job_id, seconds, None);
        let mut value = serde_json::to_value(&job).unwrap();
        value["application"]["applicationType"] = "APPLICATION_TYPE_VNC".into();
        value["application"]["vncPort"] = 5900.into();
        value["application"]["vncPassword"] = self.vnc_password.clone().into();
        value["application"]["parameters"] = serde_json::json!([
            {"name": "license", "type": "PARAMETER_TYPE_LICENSE_SERVER", "title": "License"}
        ]);
        value["application"]["environment"] =
            serde_json::json!({"MLM_LICENSE_FILE": {"var": {"variableNames": ["license"]}}});
        value["parameters"] =
            serde_json::json!({"license": {"licenseServer": {"id": "matlab-campus"}}});
        job = serde_json::from_value(value).unwrap();
        job
    }
}

/// A RabbitMQ user with the secret password and full rights on the vhost; deleted on drop.
pub struct RabbitUser {
    pub name: String,
}

impl RabbitUser {
    pub async fn create(vhost: &TestVhost, password: &str) -> Self {
        let name = format!("{}-user", vhost.name);
        let (status, body) = management(
            "PUT",
            &format!("/api/users/{}", segment(&name)),
            Some(&serde_json::json!({"password": password, "tags": ""})),
        )
        .await;
        assert!(matches!(status, 201 | 204), "user {name}: {status} {body}");
        let (status, body) = management(
            "PUT",
            &format!(
                "/api/permissions/{}/{}",
                segment(&vhost.name),
                segment(&name)
            ),
            Some(&serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"})),
        )
        .await;
        assert!(matches!(status, 201 | 204), "permissions: {status} {body}");
        Self { name }
    }
}

impl Drop for RabbitUser {
    fn drop(&mut self) {
        let path = format!("/api/users/{}", segment(&self.name));
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(management("DELETE", &path, None));
        })
        .join();
    }
}
