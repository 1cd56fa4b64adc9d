//! The corpus's cases about main.yaml: its structure, listen addresses, `acme:`, and the files
//! it names.

use super::*;

pub(crate) fn cases() -> Vec<Case> {
    const U: &str = "upstreams.yaml";
    const M: &str = "main.yaml";
    vec![
        // A section whose keys are all commented out still turns its feature on: said.
        Case::main(
            "sections_that_say_nothing",
            &format!("{MAIN_OK}cache:\n  # mem_size_mb: 64\nacme: ~\n"),
            vec![
                warn(M, 3, "cache", "says nothing (every key under it left out or commented out): the cache is on"),
                warn(M, 5, "acme", "says nothing (every key under it left out or commented out): certificates are ordered"),
                err(M, 5, "acme", "writes certificates into proxy_certificates"),
            ],
        ),
        // An integer past i64 is the key's error, beside the others: it was an unkeyed
        // "invalid YAML" that hid every other issue.
        Case::main(
            "integer_past_i64_is_the_keys_error",
            &format!("{MAIN_OK}threads: 9223372036854775808\nlog_level: bogus\n"),
            vec![
                err(M, 3, "threads", "expected a whole number"),
                err(M, 4, "log_level", "is not one of"),
            ],
        ),
        // A non-finite number stops the parse: its key is named and what to write said (it was
        // `(yaml)` and the parser's "rejected by the configured policy").
        Case::main(
            "a_non_finite_number_names_its_key",
            &format!("{MAIN_OK}threads: .inf\n"),
            vec![err(M, 3, "threads", "is not a finite number; write a number in decimal digits")],
        ),
        // A hybrid cache's directory that cannot be made is the key's error (the start failed
        // on it naming no key; check-config passed).
        Case::main(
            "a_hybrid_cache_directory_that_cannot_be_made",
            &format!("{MAIN_OK}cache:\n  storage: hybrid\n  file_path: \"main.yaml/cache\"\n"),
            vec![err(M, 5, "cache.file_path", "cannot be made").also("is not a directory")],
        ),
        // `log_level: off` unquoted is YAML 1.1's false, and the documented value: accepted. A
        // Redis URL the client would refuse at start is refused here too.
        Case::main(
            "log_level_off_unquoted_and_unusable_redis_urls",
            &format!("{MAIN_OK}log_level: off\nlimits_store: \"redis://127.0.0.1:99999\"\n"),
            vec![err(M, 4, "limits_store", "not a Redis URL")],
        ),
        // Every worker URL that cannot work is said at its entry (a list stopped at the first):
        // credentials (not repeated), a port out of range, a query; and a master listing none.
        Case::main(
            "worker_nodes_that_cannot_work",
            &format!("{MAIN_OK}cluster_member: master\nmaster_key: \"k\"\nconfig_api_enabled: true\nworker_nodes:\n  - \"http://u:pw@10.0.0.2:3000\"\n  - \"http://10.0.0.3:99999\"\n  - \"http://h:1?x=1\"\n  - \"\"\n  - \"http://10.0.0.4:3000\"\n"),
            vec![
                err(M, 7, "worker_nodes[0]", "carries credentials"),
                err(M, 8, "worker_nodes[1]", "the port is out of range"),
                err(M, 9, "worker_nodes[2]", "is not http://host:port"),
                err(M, 10, "worker_nodes[3]", "must not be empty"),
            ],
        ),
        Case::main(
            "a_master_listing_no_worker",
            &format!("{MAIN_OK}cluster_member: master\nmaster_key: \"k\"\nconfig_api_enabled: true\nworker_nodes: []\n"),
            vec![err(M, 6, "worker_nodes", "lists no worker")],
        ),
        // The checks across acme's keys point at the key at fault, not at the block's first
        // key; a name too long for its certificate's file name is refused (each retry issued
        // another certificate that could not be written).
        Case::main(
            "acme_checks_point_at_their_keys",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  email: \"a@b.test\"\n  challenge: tls-alpn-01\n  domains: [\"*.w.test\"]\n"),
            vec![
                err(M, 6, "acme.challenge", "tls-alpn-01 is answered on proxy_address_tls"),
                err(M, 7, "acme.domains", "a wildcard name can only be validated by dns-01"),
            ],
        ),
        Case::main(
            "acme_name_too_long_for_its_file",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  email: \"a@b.test\"\n  domains: [\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc.dddddddddddddddddddddddddddddddddddddddddddddddddddddd.test\"]\n"),
            vec![err(M, 6, "acme.domains", "too long for its certificate's file name")],
        ),
        // `acme: true` on a host no certificate can be ordered for is said at the host.
        Case::broken(
            "acme_true_on_hosts_that_cannot_be_ordered",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  email: \"a@b.test\"\n"),
            "upstreams:\n  \"192.168.1.10\":\n    acme: true\n    paths: {\"/\": {servers: [\"127.0.0.1:8000\"]}}\n  intranet:\n    acme: true\n    paths: {\"/\": {servers: [\"127.0.0.1:8000\"]}}\n",
            vec![
                warn(U, 2, "upstreams.192.168.1.10", "is an IP address"),
                warn(U, 5, "upstreams.intranet", "is not a DNS name"),
            ],
        )
        .warnings_only(),
        // Keep-alive times past Linux's bound (32,767 s) are errors: the kernel refused them at
        // each accept, and the values set after them, and nothing said so. Probe settings
        // without the idle time that turns probes on are said to do nothing.
        Case::main(
            "keepalive_times_past_the_kernels_bound",
            &format!("{MAIN_OK}tcp_keepalive_idle: 40000\ntcp:\n  tcp_keepalive_interval: 32768\n"),
            vec![
                err(M, 3, "tcp_keepalive_idle", "must be between 1 and 32767 (found 40000)"),
                err(M, 5, "tcp.tcp_keepalive_interval", "must be between 1 and 32767"),
            ],
        ),
        Case::main(
            "keepalive_probes_without_the_idle_time",
            &format!("{MAIN_OK}tcp_keepalive_count: 3\n"),
            vec![warn(M, 3, "tcp_keepalive_count", "not used: keep-alive probes are off without tcp_keepalive_idle")],
        )
        .warnings_only(),
        // The disk tier's keys under a memory cache do nothing: said.
        Case::main(
            "disk_keys_of_a_memory_cache",
            &format!("{MAIN_OK}cache:\n  storage: memory\n  file_size_mb: 1\n"),
            vec![warn(M, 5, "cache.file_size_mb", "not used: only storage: hybrid has a disk tier")],
        )
        .warnings_only(),
        // Settings that do nothing without another are said to (they were silently).
        Case::main(
            "settings_that_need_another",
            &format!("{MAIN_OK}access_log_format: json\nfile_server_max_connections: 5\n"),
            vec![
                warn(M, 3, "access_log_format", "not used while access_log is off"),
                warn(M, 4, "file_server_max_connections", "not used without a file server"),
            ],
        )
        .warnings_only(),
        // Both names of the log file: error_log is not read, and said so (it was silently).
        Case::main(
            "error_log_beside_log_file",
            &format!("{MAIN_OK}error_log: \"e.log\"\nlog_file: \"l.log\"\n"),
            vec![warn(M, 3, "error_log", "not read: log_file is set too")],
        )
        .warnings_only(),
        // The certificates of proxy_configs' folder are its issues, at its line (they were
        // named proxy_certificates, which the file does not have).
        Case::main(
            "proxy_configs_certificates_named_by_their_key",
            &format!("{MAIN_OK}proxy_address_tls: \"127.0.0.1:0\"\nproxy_configs: \".\"\n"),
            vec![warn(M, 4, "proxy_configs", "no usable certificate pair in")],
        )
        .with_folder("certificates")
        .warnings_only(),
        // A quoted key is the key (the issues went to proxy_configs, at line 1).
        Case::main(
            "proxy_certificates_quoted",
            &format!("{MAIN_OK}proxy_address_tls: \"127.0.0.1:0\"\n\"proxy_certificates\": \"certificates\"\n"),
            vec![warn(M, 4, "proxy_certificates", "no usable certificate pair in")],
        )
        .with_folder("certificates")
        .warnings_only(),
        // Both certificate folders named: proxy_configs' is not read, and said so.
        Case::main(
            "proxy_configs_beside_proxy_certificates",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nproxy_configs: \"/etc/aralez\"\n"),
            vec![warn(M, 4, "proxy_configs", "its certificates folder is not read")],
        )
        .warnings_only(),
        // `unsafe` is said in the check as at the start: it is medium's offer.
        Case::main(
            "the_unsafe_grade_is_medium",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nproxy_tls_grade: unsafe\n"),
            vec![warn(M, 4, "proxy_tls_grade", "offers the same as medium")],
        )
        .warnings_only(),
        // ---- acme: (DNS-01 and its provider) ----
        Case::main(
            "acme_dns_01_without_a_provider",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  challenge: dns-01\n  domains: [a.test]\n"),
            vec![err(M, 5, "acme.challenge", "set it").also("acme_dns_provider")],
        ),
        // The ACME server's trust roots are read at every order: checked here, not failing each.
        Case::main(
            "acme_ca_file_missing_or_not_pem",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [a.test]\n  ca_file: \"/nonexistent.pem\"\n"),
            vec![err(M, 6, "acme.ca_file", "cannot be read")],
        ),
        Case::main(
            "acme_ca_file_not_pem",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [a.test]\n  ca_file: \"main.yaml\"\n"),
            vec![err(M, 6, "acme.ca_file", "holds no PEM certificate")],
        ),
        Case::main(
            "acme_wildcard_needs_dns_01",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [\"*.a.test\"]\n"),
            vec![err(M, 5, "acme.domains", "only be validated by dns-01")],
        ),
        Case::main(
            "acme_unknown_dns_provider",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [a.test]\nacme_dns_provider: godaddy\n"),
            vec![err(M, 6, "acme_dns_provider", "not cloudflare, route53 or digitalocean")],
        ),
        Case::main(
            "acme_provider_without_its_environment",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [\"*.a.test\"]\nacme_dns_provider: route53\n"),
            vec![warn(M, 6, "acme_dns_provider", "AWS_ACCESS_KEY_ID").also("not set")],
        )
        .warnings_only(),
        Case::path(
            "acme_on_a_path",
            "        servers: [\"127.0.0.1:8000\"]\n        acme: true\n",
            vec![warn(U, 6, pk("acme"), "applies to a host")],
        )
        .warnings_only(),
        // A pid file or log written over a configuration file would destroy it at the start.
        Case::main(
            "files_the_process_writes_are_not_its_configuration",
            &format!("{MAIN_OK}pid_file: main.yaml\nlog_file: upstreams.yaml\n"),
            vec![
                err(M, 3, "pid_file", "is the configuration file"),
                err(M, 4, "log_file", "is the configuration file"),
            ],
        ),
        // Aralez's letter grades are read as the grade they stand for, with a warning naming it.
        Case::main(
            "letter_grades_are_warnings_that_name_the_grade",
            &format!("{MAIN_OK}proxy_tls_grade: A+\n"),
            vec![warn(M, 3, "proxy_tls_grade", "read as `high`")],
        )
        .warnings_only(),
        Case::main(
            "a_body_size_that_is_no_size",
            &format!("{MAIN_OK}client_max_body_size: 10mb\n"),
            vec![err(M, 3, "client_max_body_size", "`10mb` is not a size")],
        ),
        Case::main(
            "a_misspelt_grade_is_named",
            &format!("{MAIN_OK}proxy_tls_grade: medum\n"),
            vec![err(M, 3, "proxy_tls_grade", "(did you mean `medium`?)")],
        ),
        Case::main(
            "http3_without_a_tls_listener",
            &format!("{MAIN_OK}http3: true\n"),
            vec![err(M, 3, "http3", "proxy_address_tls")],
        ),
        Case::main(
            "tls_listener_without_certificates",
            &format!("{MAIN_OK}proxy_address_tls: \"127.0.0.1:0\"\n"),
            vec![err(M, 3, "proxy_address_tls", "needs a certificate directory")],
        ),
        Case::main(
            "admin_api_on_the_proxy_port",
            "proxy_address_http: \"127.0.0.1:16193\"\nupstreams_conf: upstreams.yaml\nconfig_address: \"127.0.0.1:16193\"\n",
            vec![err(M, 3, "config_address", "is also `proxy_address_http`'s (line 1)")],
        ),
        Case::main(
            "tls_listener_on_the_plain_port_of_every_address",
            "proxy_address_http: \"0.0.0.0:16193\"\nupstreams_conf: upstreams.yaml\nproxy_certificates: \".\"\nproxy_address_tls: \"127.0.0.1:16193\"\nfile_server_address: \"127.0.0.1:16193\"\n",
            vec![
                err(M, 4, "proxy_address_tls", "is also `proxy_address_http`'s (line 1)"),
                err(M, 5, "file_server_address", "is also `proxy_address_http`'s (line 1)"),
                warn(M, 5, "file_server_address", "nothing is served without file_server_folder"),
                // Said beside the errors too: the folder holds no pair.
                warn(M, 3, "proxy_certificates", "no usable certificate pair"),
            ],
        ),
        Case::main(
            "admin_tls_listener_without_its_certificate",
            &format!("{MAIN_OK}config_tls_address: \"127.0.0.1:0\"\nconfig_tls_key_file: \"main.yaml\"\n"),
            vec![
                err(M, 3, "config_tls_address", "needs config_tls_certificate and config_tls_key_file"),
                // Checked too, in the same run.
                err(M, 4, "config_tls_key_file", "holds no PEM private key"),
            ],
        ),
        Case::main(
            "admin_certificate_and_key_are_not_pem",
            &format!("{MAIN_OK}config_tls_address: \"127.0.0.1:0\"\nconfig_tls_certificate: \"upstreams.yaml\"\nconfig_tls_key_file: \"main.yaml\"\n"),
            vec![
                err(M, 4, "config_tls_certificate", "upstreams.yaml` holds no PEM certificate"),
                err(M, 5, "config_tls_key_file", "main.yaml` holds no PEM private key"),
            ],
        ),
        Case::main(
            "file_server_address_without_a_folder",
            &format!("{MAIN_OK}file_server_address: \"127.0.0.1:0\"\n"),
            vec![warn(M, 3, "file_server_address", "nothing is served without file_server_folder")],
        )
        .warnings_only(),
        Case::main(
            "file_server_folder_and_admin_certificate_without_their_listeners",
            &format!("{MAIN_OK}file_server_folder: \".\"\nconfig_tls_certificate: \"main.yaml\"\n"),
            vec![
                warn(M, 3, "file_server_folder", "not served without file_server_address"),
                warn(M, 4, "config_tls_certificate", "not used without config_tls_address"),
            ],
        )
        .warnings_only(),
        Case::main(
            "log_file_in_a_missing_directory",
            &format!("{MAIN_OK}log_file: \"no-such-dir/aralez.log, 10, 3, false\"\n"),
            vec![err(M, 3, "log_file", "its directory").also("no-such-dir` does not exist")],
        ),
        // The admin API without a key refuses every call: said before the start.
        Case::main(
            "config_api_without_a_master_key",
            &format!("{MAIN_OK}config_address: \"127.0.0.1:0\"\nconfig_api_enabled: true\n"),
            vec![warn(M, 4, "config_api_enabled", "no master_key: the admin API answers every call with 403")],
        )
        .warnings_only(),
        // A bad value does not hide the files checked after the values: every problem in one run
        // (each layer of errors took a CI run of its own).
        Case::main(
            "a_bad_value_and_a_missing_file_both",
            &format!("{MAIN_OK}hc_interval: 0\nlog_file: \"no-such-dir/aralez.log\"\n"),
            vec![
                err(M, 3, "hc_interval", ""),
                err(M, 4, "log_file", "no-such-dir` does not exist"),
            ],
        ),
        // The start goes on without the socket (live upgrades are then impossible): a warning.
        Case::main(
            "upgrade_sock_in_a_missing_directory",
            &format!("{MAIN_OK}upgrade_sock: \"no-such-dir/a.sock\"\n"),
            vec![warn(M, 3, "upgrade_sock", "cannot be created").also("live upgrades")],
        )
        .warnings_only(),
        Case::main(
            "error_log_in_a_missing_directory",
            &format!("{MAIN_OK}error_log: \"no-such-dir/error.log\"\n"),
            vec![err(M, 3, "error_log", "cannot be created")],
        ),
        Case::main(
            "access_log_file_in_a_missing_directory",
            &format!("{MAIN_OK}access_log: all\naccess_log_file: \"no-such-dir/access.log\"\n"),
            vec![err(M, 4, "access_log_file", "cannot be created")],
        ),
        // Not opened while the access log is off: a warning that it is unused, not an error.
        Case::main(
            "access_log_file_while_the_access_log_is_off",
            &format!("{MAIN_OK}access_log_file: \"no-such-dir/access.log\"\n"),
            vec![warn(M, 3, "access_log_file", "not written while access_log is off")],
        )
        .warnings_only(),
        // Rotation renames the file: not for a device or a link (`/dev/stdout` renamed away),
        // nor for the app log's file shared with the access log (each rotated it alone).
        Case::main(
            "a_rotated_log_that_is_not_a_regular_file",
            &format!("{MAIN_OK}access_log: all\naccess_log_file: \"/dev/null, 10\"\n"),
            vec![err(M, 4, "access_log_file", "not a regular file")],
        ),
        Case::main(
            "the_app_log_and_the_access_log_rotating_one_file",
            &format!("{MAIN_OK}log_file: \"both.log, 1, 2\"\naccess_log: all\naccess_log_file: \"both.log, 1, 2\"\n"),
            vec![err(M, 5, "access_log_file", "the same file as log_file")],
        ),
        // Keys of some Aralez versions' main.yaml that are not read here: the warning says what
        // replaces each (it said only "unknown key"); Aralez's `access_log: access` is read.
        Case::main(
            "aralez_keys_say_what_replaces_them",
            &format!("{MAIN_OK}access_log: access\ncache_size_mb: 64\nsticky_sessions: true\ntls_certificate: \"a.crt\"\n"),
            vec![
                warn(M, 4, "cache_size_mb", "use the `cache:` block"),
                warn(M, 5, "sticky_sessions", "in upstreams.yaml"),
                warn(M, 6, "tls_certificate", "put the pair in `proxy_certificates`"),
            ],
        )
        .warnings_only(),
        Case::main(
            "pid_file_is_a_directory",
            &format!("{MAIN_OK}pid_file: \"/tmp\"\n"),
            vec![err(M, 3, "pid_file", "is a directory, not a file")],
        ),
        // ---- listen addresses in main.yaml ----
        Case::main(
            "listen_without_port",
            "proxy_address_http: \"0.0.0.0\"\nupstreams_conf: upstreams.yaml\n",
            vec![err(M, 1, "proxy_address_http", "`0.0.0.0` has no port")],
        ),
        Case::main(
            "listen_host_name",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nconfig_address: \"localhost:8080\"\n",
            vec![err(M, 3, "config_address", "IP literal").also("`localhost`")],
        ),
        Case::main(
            "listen_port_out_of_range",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nproxy_address_tls: \"0.0.0.0:99999\"\n",
            vec![err(M, 3, "proxy_address_tls", "port 99999 is out of range")],
        ),
        Case::main(
            "listen_ipv6_without_brackets",
            "proxy_address_http: \"::1:6193\"\nupstreams_conf: upstreams.yaml\n",
            vec![err(M, 1, "proxy_address_http", "brackets").also("[::1]:6193")],
        ),
        // ---- main.yaml structure ----
        Case::main(
            "main_missing_required_keys",
            "threads: 2\nlog_level: info\n",
            vec![
                err(M, 1, "proxy_address_http", "required key is missing"),
                err(M, 1, "upstreams_conf", "required key is missing"),
            ],
        ),
        Case::main(
            "upstreams_conf_missing_file",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: nowhere/upstreams.yaml\n",
            vec![err(M, 2, "upstreams_conf", "`nowhere/upstreams.yaml` does not exist")],
        )
        .without_upstreams(),
        Case::main(
            "upstreams_conf_is_a_directory",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: .\n",
            vec![err(M, 2, "upstreams_conf", "is a directory")],
        ),
        // ---- what main.yaml names must exist (as nginx -t opens its files) ----
        Case::main(
            "named_files_and_accounts_missing",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
             proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: no-certs\n\
             config_tls_certificate: no.crt\nconfig_tls_key_file: no.key\n\
             file_server_folder: no-www\nfile_server_address: \"127.0.0.1:0\"\n\
             ca_file: no-ca.pem\nrunuser: no-such-user-aralez\nrungroup: no-such-group-aralez\n\
             config_tls_address: \"127.0.0.1:0\"\n",
            vec![
                err(M, 4, "proxy_certificates", "`").also("no-certs` does not exist"),
                err(M, 5, "config_tls_certificate", "no.crt` does not exist"),
                err(M, 6, "config_tls_key_file", "no.key` does not exist"),
                err(M, 7, "file_server_folder", "no-www` does not exist"),
                err(M, 9, "ca_file", "no-ca.pem` does not exist"),
                err(M, 10, "runuser", "no user `no-such-user-aralez` on this system"),
                err(M, 11, "rungroup", "no group `no-such-group-aralez` on this system"),
            ],
        ),
        Case::main(
            "pingora_user_names_no_account",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nuser: no-such-user-aralez\n",
            vec![err(M, 3, "user", "no user `no-such-user-aralez` on this system")],
        ),
        Case::main(
            "file_server_folder_is_a_file",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
             file_server_folder: upstreams.yaml\nfile_server_address: \"127.0.0.1:0\"\n",
            vec![err(M, 3, "file_server_folder", "upstreams.yaml` is not a directory")],
        ),
    ]
}
