//! Does RBAC grant a request, and is every grant used? The deploy tests compare the Role and ClusterRole
//! in `deploy/` with the calls a runner really made ([`CallRecorder`](super::CallRecorder)): a call no
//! rule grants would fail with 403 on a real cluster; a grant no call uses is privilege nobody needs.
//!
//! The matching is the API server's RBAC authorizer for resource requests: a rule matches when its
//! `apiGroups`, `resources` (`jobs`, `jobs/status`, `*`) and `verbs` each contain the request's value or
//! `*`, and its `resourceNames` (if any) contain the request's name. A Role bound by a RoleBinding
//! grants in its own namespace only; a ClusterRole bound by a ClusterRoleBinding grants everywhere.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::kube::ResourceCall;

/// Whether `rule` grants `call` (ignoring where the rule applies).
pub fn rule_grants(rule: &PolicyRule, call: &ResourceCall) -> bool {
    let has = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
    let groups = rule.api_groups.as_deref().unwrap_or_default();
    let resources = rule.resources.as_deref().unwrap_or_default();
    let names = rule.resource_names.as_deref().unwrap_or_default();
    has(&rule.verbs, call.verb)
        && has(groups, &call.group)
        && has(resources, &call.rbac_resource())
        && (names.is_empty()
            || call
                .name
                .as_deref()
                .is_some_and(|n| names.iter().any(|x| x == n)))
}

/// One (apiGroup, resource, verb) a rule grants, the unit in which grants are checked for use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// `Role` or `ClusterRole`.
    pub role: &'static str,
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(
            f,
            "{} grants {} on {} ({group})",
            self.role, self.verb, self.resource
        )
    }
}

/// The rules of one deployment: a Role in the runner's namespace and a ClusterRole.
#[derive(Debug, Clone)]
pub struct Permissions {
    /// Where the Role (and its RoleBinding) live.
    pub namespace: String,
    pub role: Vec<PolicyRule>,
    pub cluster_role: Vec<PolicyRule>,
}

/// What [`Permissions::audit`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Calls no rule grants (each distinct call once).
    pub denied: BTreeSet<ResourceCall>,
    /// Grants no call used.
    pub unused: BTreeSet<Grant>,
}

impl Audit {
    /// No denied call and no unused grant.
    pub fn is_exact(&self) -> bool {
        self.denied.is_empty() && self.unused.is_empty()
    }
}

impl std::fmt::Display for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for call in &self.denied {
            let scope = call.namespace.as_deref().unwrap_or("(cluster)");
            writeln!(
                f,
                "not granted: {} {} in {scope}",
                call.verb,
                call.metric_resource()
            )?;
        }
        for grant in &self.unused {
            writeln!(f, "never used: {grant}")?;
        }
        Ok(())
    }
}

impl Permissions {
    /// Whether the call is granted, by the Role (in its namespace) or the ClusterRole.
    pub fn grants(&self, call: &ResourceCall) -> bool {
        self.by_role(call) || self.cluster_role.iter().any(|r| rule_grants(r, call))
    }

    fn by_role(&self, call: &ResourceCall) -> bool {
        call.namespace.as_deref() == Some(self.namespace.as_str())
            && self.role.iter().any(|r| rule_grants(r, call))
    }

    /// Checks calls against the rules, both ways.
    pub fn audit<'a>(&self, calls: impl IntoIterator<Item = &'a ResourceCall>) -> Audit {
        let calls: BTreeSet<&ResourceCall> = calls.into_iter().collect();
        let mut audit = Audit::default();
        for call in &calls {
            if !self.grants(call) {
                audit.denied.insert((*call).clone());
            }
        }
        let expand = |role: &'static str,
                      rules: &[PolicyRule],
                      applies: &dyn Fn(&ResourceCall) -> bool| {
            let mut unused = BTreeSet::new();
            for rule in rules {
                for group in rule.api_groups.as_deref().unwrap_or_default() {
                    for resource in rule.resources.as_deref().unwrap_or_default() {
                        for verb in &rule.verbs {
                            let single = PolicyRule {
                                api_groups: Some(vec![group.clone()]),
                                resources: Some(vec![resource.clone()]),
                                verbs: vec![verb.clone()],
                                resource_names: rule.resource_names.clone(),
                                non_resource_urls: None,
                            };
                            let used = calls.iter().any(|c| applies(c) && rule_grants(&single, c));
                            if !used {
                                unused.insert(Grant {
                                    role,
                                    group: group.clone(),
                                    resource: resource.clone(),
                                    verb: verb.clone(),
                                });
                            }
                        }
                    }
                }
            }
            unused
        };
        let namespace = self.namespace.clone();
        audit.unused.extend(expand("Role", &self.role, &|c| {
            c.namespace.as_deref() == Some(namespace.as_str())
        }));
        audit
            .unused
            .extend(expand("ClusterRole", &self.cluster_role, &|_| true));
        audit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            resource_names: None,
            non_resource_urls: None,
        }
    }

    fn call(verb: &'static str, group: &str, resource: &str, ns: Option<&str>) -> ResourceCall {
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_owned())),
            None => (resource, None),
        };
        ResourceCall {
            verb,
            group: group.into(),
            resource: resource.into(),
            subresource: sub,
            namespace: ns.map(str::to_owned),
            name: Some("x".into()),
        }
    }

    #[test]
    fn matching_follows_the_authorizer() {
        let r = rule(&["batch.volcano.sh"], &["jobs"], &["get", "create"]);
        assert!(rule_grants(
            &r,
            &call("get", "batch.volcano.sh", "jobs", Some("a"))
        ));
        assert!(!rule_grants(
            &r,
            &call("delete", "batch.volcano.sh", "jobs", Some("a"))
        ));
        assert!(!rule_grants(&r, &call("get", "batch", "jobs", Some("a"))));
        // A subresource needs its own entry.
        assert!(!rule_grants(
            &r,
            &call("get", "batch.volcano.sh", "jobs/status", Some("a"))
        ));
        let star = rule(&["*"], &["*"], &["*"]);
        assert!(rule_grants(&star, &call("patch", "", "pods/status", None)));
        let mut named = rule(&[""], &["configmaps"], &["get"]);
        named.resource_names = Some(vec!["pause".into()]);
        assert!(!rule_grants(
            &named,
            &call("get", "", "configmaps", Some("a"))
        ));
        let mut pause = call("get", "", "configmaps", Some("a"));
        pause.name = Some("pause".into());
        assert!(rule_grants(&named, &pause));
    }

    #[test]
    fn a_role_grants_in_its_namespace_only() {
        let p = Permissions {
            namespace: "runner".into(),
            role: vec![rule(&["coordination.k8s.io"], &["leases"], &["get"])],
            cluster_role: vec![],
        };
        let lease = |ns| call("get", "coordination.k8s.io", "leases", Some(ns));
        assert!(p.grants(&lease("runner")));
        assert!(!p.grants(&lease("elsewhere")));
        assert!(!p.grants(&call("get", "coordination.k8s.io", "leases", None)));
    }

    #[test]
    fn the_audit_finds_both_kinds_of_mismatch() {
        let p = Permissions {
            namespace: "runner".into(),
            role: vec![rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "delete"],
            )],
            cluster_role: vec![rule(&["batch.volcano.sh"], &["jobs"], &["create", "list"])],
        };
        let calls = [
            call("get", "coordination.k8s.io", "leases", Some("runner")),
            call("create", "batch.volcano.sh", "jobs", Some("u-1")),
            call("list", "batch.volcano.sh", "jobs", None),
            call("create", "", "pods", Some("u-1")),
            // A lease call outside the runner's namespace uses nothing and is denied.
            call("delete", "coordination.k8s.io", "leases", Some("u-1")),
        ];
        let audit = p.audit(&calls);
        assert_eq!(
            audit
                .denied
                .iter()
                .map(|c| (c.verb, c.resource.as_str()))
                .collect::<Vec<_>>(),
            vec![("create", "pods"), ("delete", "leases")]
        );
        assert_eq!(
            audit
                .unused
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>(),
            vec!["Role grants delete on leases (coordination.k8s.io)"]
        );
        assert!(!audit.is_exact());
        let text = audit.to_string();
        assert!(text.contains("not granted: create pods in u-1"), "{text}");
        let exact = p.audit(&calls[..3]);
        assert!(!exact.is_exact(), "delete on leases is still unused");
        let p = Permissions {
            role: vec![rule(&["coordination.k8s.io"], &["leases"], &["get"])],
            ..p
        };
        assert!(p.audit(&calls[..3]).is_exact());
    }
}
