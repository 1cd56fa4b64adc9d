//! The corpus's cases about upstreams.yaml and conf.d: YAML syntax, types, values, structure,
//! hostile files, and errors in both files at once.

use super::*;

pub(crate) fn cases() -> Vec<Case> {
    const U: &str = "upstreams.yaml";
    const M: &str = "main.yaml";
    vec![
        // ---- YAML syntax ----
        Case::broken(
            "yaml_unclosed_flow_sequence",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"\n",
            vec![err(U, 4, "(yaml)", "invalid YAML").also("unclosed")],
        ),
        Case::path(
            "yaml_bad_indentation",
            "        servers: [\"127.0.0.1:8000\"]\n     rate_limit: 3\n",
            vec![err(U, 6, "(yaml)", "invalid YAML")],
        ),
        Case::broken(
            "yaml_tab_indentation",
            MAIN_OK,
            "upstreams:\n  a.com:\n\tpaths:\n      \"/\":\n        servers: [\"127.0.0.1:8000\"]\n",
            vec![err(U, 3, "(yaml)", "invalid YAML").also("tab")],
        ),
        Case::main(
            "yaml_syntax_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: [upstreams.yaml\nthreads: 2\n",
            vec![err(M, 3, "(yaml)", "invalid YAML").also("the `[` on line 2 closed?")],
        ),
        Case::path(
            "yaml_duplicate_key_in_upstreams",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limit: 5\n        rate_limit: 6\n",
            vec![err(U, 7, "(yaml)", "duplicate key `rate_limit`")],
        ),
        Case::main(
            "yaml_duplicate_key_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nproxy_address_http: \"127.0.0.1:1\"\n",
            vec![err(M, 3, "(yaml)", "duplicate key `proxy_address_http`")],
        ),
        // A main.yaml that does not parse still says where upstreams.yaml is, on its line:
        // that file's issues came out only once main.yaml was mended.
        Case::broken(
            "a_main_that_does_not_parse_still_has_its_upstreams_checked",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\" # routes\nthreads: 2\nthreads: 3\n",
            &format!("{PATH_HEAD}        servers: []\n"),
            vec![
                err(M, 4, "(yaml)", "duplicate key `threads`"),
                err(U, 5, pk("servers"), "the list of servers is empty"),
            ],
        ),
        Case::broken(
            "yaml_two_documents",
            MAIN_OK,
            &format!("{UPS_OK}---\nb.com: {{}}\n"),
            vec![err(U, 6, "(yaml)", "more than one YAML document")],
        ),
        // ---- provider ----
        // Every discovery section present is watched, whatever `provider` says (Aralez watches
        // the provider's only): where the two differ, a warning.
        Case::broken(
            "provider_and_sections_disagree",
            MAIN_OK,
            &format!("provider: kubernetes\nconsul:\n  servers: [\"http://127.0.0.1:8500\"]\n  services: []\n{UPS_OK}"),
            vec![
                warn(U, 1, "provider", "the `consul:` section is watched all the same"),
                warn(U, 1, "provider", "there is no `kubernetes:` section"),
            ],
        )
        .warnings_only(),
        // With no `provider`, Aralez reads `file` and ignores the sections aralez watches: said
        // at each section. A port out of range is an error (it was read as no port: 80), and a
        // token that cannot be a header value too (trimmed first: a block scalar's newline).
        Case::broken(
            "discovery_without_provider_bad_ports_and_token",
            MAIN_OK,
            &format!("consul:\n  servers: [\"http://127.0.0.1:86536\"]\n  token: \"a\\nb\"\n  services: []\nkubernetes:\n  servers: [\"10.0.0.1:0\"]\n  services: []\n{UPS_OK}"),
            vec![
                warn(U, 1, "consul", "`provider` is not set"),
                err(U, 2, "consul.servers[0]", "the port is out of range"),
                err(U, 3, "consul.token", "a character a header cannot carry"),
                warn(U, 5, "kubernetes", "set `provider: kubernetes`"),
                err(U, 6, "kubernetes.servers[0]", "the port is out of range"),
            ],
        ),
        // Credentials in a Consul URL are never used and would be logged: an error that does
        // not repeat them.
        Case::broken(
            "consul_url_with_credentials",
            MAIN_OK,
            &format!("provider: consul\nconsul:\n  servers: [\"http://admin:hunter2@127.0.0.1:8500\"]\n  services: []\n{UPS_OK}"),
            vec![err(U, 3, "consul.servers[0]", "carries credentials")],
        ),
        // Kubernetes talks to the first API server only: more are a warning, not a failover.
        Case::broken(
            "kubernetes_several_servers",
            MAIN_OK,
            &format!("provider: kubernetes\nkubernetes:\n  servers: [\"https://10.0.0.1:6443\", \"https://10.0.0.2:6443\"]\n  services: []\n{UPS_OK}"),
            vec![warn(U, 3, "kubernetes.servers", "only the first API server is used")],
        )
        .warnings_only(),
        // An API server the watcher could not use is refused here (it failed only once
        // discovery started), credentials without repeating them.
        Case::broken(
            "kubernetes_bad_servers",
            MAIN_OK,
            &format!("provider: kubernetes\nkubernetes:\n  servers:\n    - \"ftp://10.0.0.1:6443\"\n    - \"not a host\"\n    - \"https://admin:hunter2@10.0.0.1:6443\"\n    - \"10.0.0.1:6443\"\n  services: []\n{UPS_OK}"),
            vec![
                err(U, 4, "kubernetes.servers[0]", "`ftp://10.0.0.1:6443` is not an API server address"),
                err(U, 5, "kubernetes.servers[1]", "`not a host` is not an API server address"),
                err(U, 6, "kubernetes.servers[2]", "the URL carries credentials, which are never sent"),
            ],
        ),
        // A namespace or service name Kubernetes cannot have is refused here: it failed only
        // once discovery started ("invalid uri character"), or, with a `,` in it, selected
        // other slices than the service's.
        Case::broken(
            "kubernetes_names",
            MAIN_OK,
            &format!("provider: kubernetes\nkubernetes:\n  servers: [\"https://10.0.0.1:6443\"]\n  namespace: \"Default NS\"\n  services:\n    - {{ hostname: a.test, upstream: \"web,foo!=bar\" }}\n    - {{ hostname: b.test, upstream: 9web }}\n    - {{ hostname: c.test, upstream: web-2 }}\n{UPS_OK}"),
            vec![
                err(U, 4, "kubernetes.namespace", "`Default NS` is not a Kubernetes namespace name"),
                err(U, 6, "kubernetes.services[0].upstream", "`web,foo!=bar` is not a Kubernetes service name"),
                err(U, 7, "kubernetes.services[1].upstream", "`9web` is not a Kubernetes service name"),
            ],
        ),
        // A discovered service's hostname is read as a host of the file: `default` in lower
        // case is a host like any other, and a second service on the same host and path gets
        // no request.
        Case::broken(
            "discovered_hosts_read_as_the_files",
            MAIN_OK,
            &format!("provider: consul\nconsul:\n  servers: [\"http://127.0.0.1:8500\"]\n  services:\n    - {{ hostname: default, upstream: web }}\n    - {{ hostname: a.test, upstream: web }}\n    - {{ hostname: A.test, upstream: api }}\n{UPS_OK}"),
            vec![
                warn(U, 5, "consul.services[0].hostname", "the host that catches every other is `DEFAULT`"),
                warn(U, 7, "consul.services[2]", "a.test/ is routed by consul.services[1] already"),
            ],
        )
        .warnings_only(),
        // A discovered service on a host and path the file routes itself gets no request.
        Case::broken(
            "discovered_service_hidden_by_the_files_route",
            MAIN_OK,
            &format!("provider: consul\nconsul:\n  servers: [\"http://127.0.0.1:8500\"]\n  services:\n    - {{ hostname: example.com, upstream: web }}\n    - {{ hostname: example.com, upstream: api, path: /api }}\n{UPS_OK}"),
            vec![warn(
                U,
                5,
                "consul.services[0]",
                "example.com/ is routed by this file's own host `example.com` too: the file's route wins",
            )],
        )
        .warnings_only(),
        // An empty file (a failed template render) serves nothing: said, and refused on reload.
        Case::broken(
            "upstreams_empty",
            MAIN_OK,
            "# rendered from nothing\n",
            vec![warn(U, 1, "(file)", "the file is empty: no route, every request gets 404")],
        )
        .warnings_only(),
        // So does one whose template left only a document marker around nothing.
        Case::broken(
            "upstreams_only_a_marker",
            MAIN_OK,
            "--- # rendered from nothing\n",
            vec![warn(U, 1, "(file)", "the file is empty: no route, every request gets 404")],
        )
        .warnings_only(),
        // ---- wrong types ----
        Case::path(
            "type_string_for_number",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limit: \"ten\"\n",
            vec![err(U, 6, pk("rate_limit"), "expected a whole number, found a string `ten`")],
        ),
        Case::broken(
            "type_list_for_map",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths: [\"/\", \"/api\"]\n",
            vec![err(U, 3, "upstreams.a.com.paths", "expected a mapping, found a list")],
        ),
        Case::path(
            "type_map_for_list",
            "        servers:\n          primary: \"127.0.0.1:8000\"\n",
            vec![err(U, 6, pk("servers"), "expected a list of strings, found a mapping")],
        ),
        Case::main(
            "type_string_for_number_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreads: many\n",
            vec![err(M, 3, "threads", "expected a whole number, found a string `many`")],
        ),
        // A number as written: `02` was said as "found a number `2`", what was asked for.
        Case::main(
            "a_leading_zero_or_a_number_too_large",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreads: 02\nmax_connections: 99999999999999999999\nmax_request_header_bytes: 1e5\n",
            vec![
                err(M, 3, "threads", "found a number `02` (a leading zero: write it without one)"),
                err(M, 4, "max_connections", "found a number `99999999999999999999` (too large)"),
                err(M, 5, "max_request_header_bytes", "found a number `1e5` (a fraction or an exponent as written"),
            ],
        ),
        Case::path(
            "type_bad_boolean",
            "        servers: [\"127.0.0.1:8000\"]\n        to_https: maybe\n",
            vec![err(U, 6, pk("to_https"), "expected true or false, found a string `maybe`")],
        ),
        // ---- backend addresses ----
        Case::path(
            "server_without_port",
            "        servers: [\"127.0.0.1\"]\n",
            vec![err(U, 5, pk("servers[0]"), "`127.0.0.1` has no port")],
        ),
        Case::path(
            "server_port_zero",
            "        servers:\n          - \"127.0.0.1:8000\"\n          - \"127.0.0.1:0\"\n",
            vec![err(U, 7, pk("servers[1]"), "port 0 is not a valid port")],
        ),
        Case::path(
            "server_port_out_of_range",
            "        servers: [\"127.0.0.1:70000\"]\n",
            vec![err(U, 5, pk("servers[0]"), "port 70000 is out of range")],
        ),
        Case::path(
            "server_port_not_numeric",
            "        servers: [\"backend.local:http\"]\n",
            vec![err(U, 5, pk("servers[0]"), "port `http` is not a number")],
        ),
        Case::path(
            "server_ipv6_without_brackets",
            "        servers: [\"::1:8080\"]\n",
            vec![err(U, 5, pk("servers[0]"), "brackets").also("[::1]:8080")],
        ),
        Case::path(
            "server_bad_scheme",
            "        servers: [\"ftp://127.0.0.1:21\"]\n",
            vec![err(U, 5, pk("servers[0]"), "unknown scheme `ftp://`")],
        ),
        Case::path(
            "server_no_host",
            "        servers: [\":8000\"]\n",
            vec![err(U, 5, pk("servers[0]"), "`:8000` has no host")],
        ),
        Case::path(
            "server_with_path",
            "        servers: [\"127.0.0.1:8000/api\"]\n",
            vec![err(U, 5, pk("servers[0]"), "without a path")],
        ),
        // ---- headers ----
        Case::path(
            "header_without_colon",
            "        servers: [\"127.0.0.1:8000\"]\n        server_headers: [\"X-From aralez\"]\n",
            vec![err(U, 6, pk("server_headers[0]"), "`X-From aralez` has no `:`")],
        ),
        // ---- compress ----
        Case::path(
            "compress_not_a_boolean",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: gzip\n",
            vec![err(U, 6, pk("compress"), "expected true, false or a mapping of min_size and types")],
        ),
        Case::path(
            "compress_negative_min_size",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: {min_size: -5}\n",
            vec![err(U, 6, pk("compress.min_size"), "must not be negative")],
        ),
        Case::path(
            "compress_bad_media_type",
            "        servers: [\"127.0.0.1:8000\"]\n        compress:\n          types: [\"text/html\", \"text/html; charset=utf-8\"]\n",
            vec![err(U, 7, pk("compress.types[1]"), "is not a media type").also("no parameters")],
        ),
        Case::path(
            "compress_empty_types",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: {types: []}\n",
            vec![err(U, 6, pk("compress.types"), "the list of types is empty")],
        ),
        Case::path(
            "compress_unknown_key",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: {min_size: 10, level: 9}\n",
            vec![warn(U, 6, pk("compress.level"), "unknown key `level`")],
        )
        .warnings_only(),
        Case::path(
            "header_name_with_space",
            "        servers: [\"127.0.0.1:8000\"]\n        client_headers:\n          - \"X-Ok: 1\"\n          - \"Bad Name: x\"\n",
            vec![err(U, 8, pk("client_headers[1]"), "`Bad Name` is not a valid header name")
                .also("space")],
        ),
        Case::path(
            "header_value_control_char",
            "        servers: [\"127.0.0.1:8000\"]\n        client_headers: [\"X-A: a\\x01b\"]\n",
            vec![err(U, 6, pk("client_headers[0]"), "value of `X-A` contains a control character")],
        ),
        // ---- unknown keys (warnings) ----
        Case::main(
            "unknown_key_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreds: 4\n",
            vec![warn(M, 3, "threds", "unknown key `threds`, did you mean `threads`?")],
        )
        .warnings_only(),
        Case::broken(
            "unknown_key_at_host_level",
            MAIN_OK,
            "upstreams:\n  a.com:\n    rate_limt: 10\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![warn(U, 3, "upstreams.a.com.rate_limt", "did you mean `rate_limit`?")],
        )
        .warnings_only(),
        Case::path(
            "unknown_key_at_path_level",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limt: 10\n",
            vec![warn(U, 6, pk("rate_limt"), "unknown key `rate_limt`, did you mean `rate_limit`?")],
        )
        .warnings_only(),
        // A misspelt wrapper (or main.yaml handed over as upstreams): nothing routed and only
        // unknown keys. Loaded, it removed every route with a warning said.
        Case::broken(
            "wrapper_misspelt_routes_nothing",
            MAIN_OK,
            "upstrems:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![
                warn(U, 1, "upstrems", "did you mean `upstreams`?"),
                err(U, 1, "upstrems", "nothing here is a route").also("remove every route"),
            ],
        ),
        Case::broken(
            "main_yaml_as_upstreams_routes_nothing",
            MAIN_OK,
            "proxy_address_http: \"127.0.0.1:0\"\nthreads: 2\n",
            vec![
                warn(U, 1, "proxy_address_http", "unknown key"),
                warn(U, 2, "threads", "unknown key"),
                err(U, 1, "proxy_address_http", "`proxy_address_http`, `threads` are not keys"),
            ],
        ),
        Case::path(
            "a_key_begun_is_named",
            "        servers: [\"127.0.0.1:8000\"]\n        redirect: \"https://a.com/\"\n",
            vec![warn(U, 6, pk("redirect"), "did you mean `redirect_to`?")],
        )
        .warnings_only(),
        // ---- authorization ----
        // A misspelt `authorization` served the route to anyone, with a warning only.
        Case::path(
            "auth_key_misspelt",
            "        servers: [\"127.0.0.1:8000\"]\n        authorisation: {type: basic, data: \"a:b\"}\n",
            vec![err(U, 6, pk("authorisation"), "did you mean `authorization`?")],
        ),
        Case::path(
            "auth_unknown_type",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: jwk\n          data: secret\n",
            vec![err(U, 7, pk("authorization.type"), "unknown auth type `jwk`, did you mean `jwt`?")],
        ),
        Case::path(
            "auth_basic_without_data",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization: {type: basic}\n",
            vec![err(U, 6, pk("authorization"), "auth type `basic` needs `data`")],
        ),
        // A jwt rule without data takes master_key or JWT_KEY; with neither set (MAIN_OK has
        // no master_key), every request of the route was a 503.
        Case::path(
            "auth_jwt_without_data_or_master_secret",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: jwt\n",
            vec![err(U, 7, pk("authorization"), "neither is set")],
        ),
        Case::path(
            "auth_apikey_without_data",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: apikey\n",
            vec![err(U, 7, pk("authorization"), "auth type `apikey` needs `data`")],
        ),
        Case::path(
            "auth_forward_without_data",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: forward\n          data: \"\"\n",
            vec![err(U, 7, pk("authorization"), "auth type `forward` needs `data`")],
        ),
        Case::path(
            "auth_forward_not_a_url",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: forward\n          data: auth.local/check\n",
            vec![err(U, 8, pk("authorization.data"), "`auth.local/check` is not an http:// or https:// URL")],
        ),
        // Credentials in the URL would go out as the Host field: an error that does not repeat
        // them. `data` and `creds` (its older name) both given: which one wins is no answer.
        Case::path(
            "auth_forward_url_with_credentials_and_data_given_twice",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: forward\n          data: \"http://svc:pw@127.0.0.1:9/ok\"\n      /b:\n        servers: [\"127.0.0.1:8000\"]\n        authorization: {type: basic, data: \"a:b\", creds: \"c:d\"}\n",
            vec![
                err(U, 8, pk("authorization.data"), "the URL carries credentials, which would be sent as the `Host` field"),
                err(U, 11, "upstreams.a.com.paths./b.authorization.creds", "given twice: keep one"),
            ],
        ),
        Case::path(
            "auth_basic_data_without_colon",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: basic\n          data: justauser\n",
            vec![err(U, 8, pk("authorization.data"), "must be `user:password`")],
        ),
        // ---- limits and values ----
        Case::main(
            "hc_interval_zero",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nhc_interval: 0\n",
            vec![err(M, 3, "hc_interval", "must be between 1 and 3600 (found 0)")],
        ),
        Case::path(
            "negative_rate_limit",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limit: -5\n",
            vec![err(U, 6, pk("rate_limit"), "must not be negative (found -5)")],
        ),
        Case::path(
            "bad_sticky_sessions",
            "        servers: [\"127.0.0.1:8000\"]\n        sticky_sessions: sometimes\n",
            vec![err(U, 6, pk("sticky_sessions"), "true, false or a number of seconds")],
        ),
        Case::path(
            "redirect_not_absolute",
            "        redirect_to: \"www.example.com\"\n",
            vec![err(U, 5, pk("redirect_to"), "must be an absolute URL")],
        ),
        Case::path(
            "redirect_with_a_query",
            "        redirect_to: \"https://x.example/?a=1\"\n",
            vec![err(U, 5, pk("redirect_to"), "has a query or a fragment")],
        ),
        Case::path(
            "redirect_with_a_fragment",
            "        redirect_to: \"https://x.example/p#top\"\n",
            vec![err(U, 5, pk("redirect_to"), "has a query or a fragment")],
        ),
        // A port is digits (`+80` went out in `Location`).
        Case::path(
            "redirect_with_a_signed_port",
            "        redirect_to: \"https://x.example:+80\"\n",
            vec![err(U, 5, pk("redirect_to"), "the port is out of range")],
        ),
        // The line main.yaml that does not parse says upstreams_conf on may start with a BOM
        // and end with a comment after a tab.
        Case::broken(
            "a_main_that_does_not_parse_with_a_bom_and_a_tabbed_comment",
            "\u{feff}upstreams_conf: upstreams.yaml\t# routes\nproxy_address_http: \"127.0.0.1:0\"\nthreads: 2\nthreads: 3\n",
            &format!("{PATH_HEAD}        servers: []\n"),
            vec![
                err(M, 4, "(yaml)", "duplicate key `threads`"),
                err(U, 5, pk("servers"), "the list of servers is empty"),
            ],
        ),
        // A route's cache_ttl with no cache in main.yaml does nothing: said.
        Case::path(
            "cache_ttl_without_a_cache",
            "        servers: [\"127.0.0.1:8000\"]\n        cache_ttl: 60\n",
            vec![warn(U, 6, pk("cache_ttl"), "but main.yaml has no `cache:` block")],
        )
        .warnings_only(),
        // A port past 65535 went out in `Location` (SPEC §3.4 says so of servers' ports).
        Case::path(
            "redirect_with_a_port_out_of_range",
            "        redirect_to: \"http://x.example:99999\"\n",
            vec![err(U, 5, pk("redirect_to"), "the port is out of range (1 to 65535)")],
        ),
        // ---- structure ----
        Case::path(
            "empty_servers_list",
            "        rate_limit: 5\n        servers: []\n",
            vec![err(U, 6, pk("servers"), "the list of servers is empty")],
        ),
        Case::broken(
            "path_without_leading_slash",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n      api:\n        servers: [\"127.0.0.1:8001\"]\n",
            vec![err(U, 5, "upstreams.a.com.paths.api", "path `api` must start with `/`")],
        ),
        Case::broken(
            "path_without_servers",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n      \"/api\":\n        rate_limit: 5\n",
            vec![err(U, 5, "upstreams.a.com.paths./api", "path `/api` has no `servers`")],
        ),
        Case::broken(
            "host_without_paths",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n  b.com:\n    rate_limit: 5\n",
            vec![err(U, 5, "upstreams.b.com", "host `b.com` has no `paths`")],
        ),
        Case::broken(
            "duplicate_host_other_case",
            MAIN_OK,
            "upstreams:\n  example.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n  Example.COM:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8001\"]}\n",
            vec![err(U, 5, "upstreams.Example.COM", "host `example.com` is defined twice (first on line 2)")],
        ),
        Case::broken(
            "both_shapes_mixed",
            MAIN_OK,
            "rate_limit: 100\nupstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\nb.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1:8001\"]}\n",
            vec![err(U, 6, "b.com", "under `upstreams:` (line 2)").also("`b.com`, line 6")],
        ),
        Case::broken(
            "document_not_a_mapping",
            MAIN_OK,
            "- \"127.0.0.1:8000\"\n- \"127.0.0.1:8001\"\n",
            vec![err(U, 1, "(document)", "expected a mapping, found a list")],
        ),
        Case::broken(
            "legacy_shape_errors",
            MAIN_OK,
            "sticky_sessions: maybe\nheaders: [\"X-A 1\"]\nauthorization: {type: basic, creds: nocolon}\nb.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1\"]}\n",
            vec![
                err(U, 1, "sticky_sessions", "found a string `maybe`"),
                err(U, 2, "headers[0]", "has no `:`"),
                err(U, 3, "authorization.creds", "must be `user:password`"),
                err(U, 6, "b.com.paths./.servers[0]", "has no port"),
            ],
        ),
        // ---- hostile files ----
        Case::broken(
            "alias_bomb",
            MAIN_OK,
            &alias_bomb(),
            vec![err(U, 6, "(yaml)", "alias bomb")],
        ),
        Case::broken(
            "fifty_megabytes",
            MAIN_OK,
            "",
            vec![err(U, 1, "(file)", "over the 8 MiB limit")],
        )
        .with_upstreams_bytes(fifty_megabytes()),
        Case::broken(
            "not_utf8",
            MAIN_OK,
            "",
            vec![err(U, 6, "(file)", "not valid UTF-8").also("0xe9")],
        )
        .with_upstreams_bytes(
            [UPS_OK.as_bytes(), b"# caf\xe9 au lait\n"].concat(),
        ),
        Case::main(
            "main_not_utf8",
            "",
            vec![err(M, 2, "(file)", "not valid UTF-8")],
        )
        .with_main_bytes(b"proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \xff\xfe\n".to_vec()),
        // ---- conf.d ----
        Case::broken(
            "conf_d_file_with_error",
            MAIN_OK,
            UPS_OK,
            vec![err("conf.d/20-bad.yaml", 4, "b.com.paths./api.servers[1]", "port 99999 is out of range")],
        )
        .with_conf_d("10-good.yaml", "c.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1:8002\"]}\n")
        .with_conf_d(
            "20-bad.yaml",
            "b.com:\n  paths:\n    \"/api\":\n      servers: [\"127.0.0.1:8001\", \"127.0.0.1:99999\"]\n",
        ),
        Case::broken(
            "conf_d_file_bad_yaml",
            MAIN_OK,
            UPS_OK,
            vec![err("conf.d/b.yaml", 2, "paths", "invalid YAML")],
        )
        .with_conf_d("b.yaml", "b.com:\n  paths: {\"/\": {servers: [\"127.0.0.1:8001\"]}\n"),
        // ---- many errors in one file ----
        Case::broken(
            "several_errors_in_one_file",
            MAIN_OK,
            "upstreams:
  a.com:
    paths:
      \"/\":
        servers:
          - \"127.0.0.1\"
          - \"127.0.0.1:8000\"
          - \"[::1]:99999\"
        rate_limit: -1
        client_headers: [\"NoColon\"]
        authorization: {type: jwk}
      api:
        servers: [\"127.0.0.1:8000\"]
  b.com:
    paths:
      \"/\": {servers: []}
",
            vec![
                err(U, 6, pk("servers[0]"), "has no port"),
                err(U, 8, pk("servers[2]"), "port 99999 is out of range"),
                err(U, 9, pk("rate_limit"), "must not be negative"),
                err(U, 10, pk("client_headers[0]"), "has no `:`"),
                err(U, 11, pk("authorization.type"), "did you mean `jwt`?"),
                err(U, 12, "upstreams.a.com.paths.api", "must start with `/`"),
                err(U, 16, "upstreams.b.com.paths./.servers", "the list of servers is empty"),
            ],
        ),
        Case::main(
            "several_errors_in_main",
            "proxy_address_http: \"0.0.0.0\"\nupstreams_conf: upstreams.yaml\nthreads: 0\nlog_level: loud\ndaemon: [yes]\nthreds: 3\n",
            vec![
                err(M, 1, "proxy_address_http", "has no port"),
                err(M, 3, "threads", "must be between 1 and 1024 (found 0)"),
                err(M, 4, "log_level", "`loud` is not one of"),
                err(M, 5, "daemon", "expected true or false, found a list"),
                warn(M, 6, "threds", "did you mean `threads`?"),
            ],
        ),
        Case::main(
            "log_keys_bad",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
             log_file: \"a.log, 0, 3, true\"\nlog_pattern: \"{d} {q}\"\n\
             access_log_file: \"b.log, 10, 2, maybe\"\naccess_log_format: xml\naccess_log: all\n",
            vec![
                err(M, 3, "log_file", "max MB `0` is not a whole number from 1"),
                err(M, 4, "log_pattern", "`{q}` is not a known piece"),
                err(M, 5, "access_log_file", "compress `maybe` is not true or false"),
                err(M, 6, "access_log_format", "`xml` is not one of: logfmt, json"),
            ],
        ),
        // ---- paths and hosts no request could match ----
        // Prefixes are matched in the form request paths are normalised to (encoding, case,
        // repeated slashes); one that no request could match is an error, one that matches as
        // another prefix does a warning.
        Case::broken(
            "paths_no_request_could_match",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"/q?x\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"/dot/../x\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"//double\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"/case\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"/Case\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"/caf\u{e9}\":\n        servers: [\"127.0.0.1:8000\"]\n\
             \x20     \"/caf%c3%a9\":\n        servers: [\"127.0.0.1:8000\"]\n",
            vec![
                err(U, 6, "upstreams.a.com.paths./q?x", "holds a query"),
                err(U, 8, "upstreams.a.com.paths./dot/../x", "can never match"),
                warn(U, 10, "upstreams.a.com.paths.//double", "matches as `/double`"),
                warn(U, 14, "upstreams.a.com.paths./Case", "the same requests as `/case` (line 12)"),
                warn(U, 18, "upstreams.a.com.paths./caf%c3%a9", "the same requests as `/caf\u{e9}` (line 16)"),
            ],
        ),
        Case::broken(
            "hosts_no_request_could_match_as_written",
            MAIN_OK,
            "upstreams:\n  \"port.test:8080\":\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n\
             \x20 \"*.wild.test\":\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n\
             \x20 default:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![
                warn(U, 2, "upstreams.port.test:8080", "is `port.test`: requests are routed by their host without its port"),
                warn(U, 5, "upstreams.*.wild.test", "host names match exactly"),
                warn(U, 8, "upstreams.default", "the host that catches every other is `DEFAULT`"),
            ],
        )
        .warnings_only(),
        // An IPv6 host written without brackets was cut at its last `:` as if that were a port
        // (`::2` became the host `:`), with a warning that said so.
        Case::broken(
            "an_ipv6_host_without_brackets",
            MAIN_OK,
            "upstreams:\n  \"::2\":\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![err(U, 2, "upstreams.::2", "`::2` is an IPv6 address: write it in brackets, `[::2]`")],
        ),
        // A host with an empty label, and one in Unicode, match no request's Host.
        Case::broken(
            "hosts_no_client_sends",
            MAIN_OK,
            "upstreams:\n  \"a..b\":\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n  \"b\u{fc}cher.test\":\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![
                err(U, 2, "upstreams.a..b", "`a..b` is not a valid host name"),
                err(U, 5, "upstreams.b\u{fc}cher.test", "in its punycode form (`xn--...`)"),
            ],
        ),
        // A route's header lists may not set framing or hop-by-hop fields: `Content-Length:0`
        // emptied every request body.
        Case::path(
            "header_lists_set_no_framing",
            "        servers: [\"127.0.0.1:8000\"]\n        server_headers: [\"Content-Length:0\", \"X-Ok:1\"]\n        client_headers: [\"Transfer-Encoding:chunked\"]\n",
            vec![
                err(U, 6, pk("server_headers[0]"), "`content-length` describes the connection or how the message is framed"),
                err(U, 7, pk("client_headers[0]"), "`transfer-encoding` describes the connection"),
            ],
        ),
        // `server_headers` that set what the proxy tells the backend: its Host and the client's
        // address were replaced without a word.
        Case::path(
            "server_headers_replace_what_the_proxy_says",
            "        servers: [\"127.0.0.1:8000\"]\n        server_headers: [\"Host:evil.test\", \"X-Forwarded-For:1.1.1.1\", \"X-Ok:1\"]\n        client_headers: [\"Host:fine.test\"]\n",
            vec![
                warn(U, 6, pk("server_headers[0]"), "`host` replaces what the proxy tells the backend (the host the client asked for)"),
                warn(U, 6, pk("server_headers[1]"), "`x-forwarded-for` replaces what the proxy tells the backend (the client's address)"),
            ],
        )
        .warnings_only(),
        // A host with an empty `paths` takes its requests and answers 404; a server that is
        // digits and dots but no address would be looked up as a name.
        Case::broken(
            "empty_paths_and_a_mistyped_address",
            MAIN_OK,
            "upstreams:\n  a.test:\n    paths: {}\n  b.test:\n    paths:\n      \"/\": {servers: [\"300.1.1.1:80\"]}\n",
            vec![
                warn(U, 3, "upstreams.a.test.paths", "has no path: its requests get 404"),
                err(U, 6, "upstreams.b.test.paths./.servers[0]", "looks like an IPv4 address but is not one"),
            ],
        ),
        // Across the two files: a redirect to an HTTPS port nothing listens on.
        Case::path(
            "to_https_without_a_tls_listener",
            "        servers: [\"127.0.0.1:8000\"]\n        to_https: true\n",
            vec![warn(U, 6, pk("to_https"), "main.yaml has no `proxy_address_tls`")],
        )
        .warnings_only(),
        // The same in flow style, spelled `yes`, and in a conf.d file: the file, line and key
        // where it is (it was found by searching upstreams.yaml's text, at line 1 for these).
        Case::path(
            "to_https_in_flow_style",
            "        {servers: [\"127.0.0.1:8000\"], to_https: yes}\n",
            vec![warn(U, 5, pk("to_https"), "main.yaml has no `proxy_address_tls`")],
        )
        .warnings_only(),
        Case::broken(
            "to_https_in_a_conf_d_file",
            MAIN_OK,
            UPS_OK,
            vec![warn("conf.d/b.yaml", 4, "b.com.paths./.to_https", "main.yaml has no `proxy_address_tls`")],
        )
        .with_conf_d("b.yaml", "b.com:\n  paths:\n    \"/\":\n      to_https: true\n      servers: [\"127.0.0.1:8001\"]\n")
        .warnings_only(),
        // A route's own authorization under a global one: it applies (SPEC §8), where Aralez
        // let the global one win; said, for operators coming from Aralez.
        Case::broken(
            "a_routes_authorization_under_a_global_one",
            MAIN_OK,
            "authorization: {type: basic, data: \"root:toor\"}\nupstreams:\n  a.test:\n    paths:\n      \"/\":\n        servers: [\"127.0.0.1:8000\"]\n        authorization: {type: basic, data: \"admin:admin\"}\n",
            vec![warn(U, 7, "upstreams.a.test.paths./.authorization", "not the global one")],
        )
        .warnings_only(),
        // `acme: true` with no `acme:` block in main.yaml: nothing orders its certificate.
        Case::broken(
            "acme_true_without_an_acme_block",
            MAIN_OK,
            "upstreams:\n  a.test:\n    acme: true\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![warn(U, 3, "upstreams.a.test.acme", "main.yaml has no `acme:` block")],
        )
        .warnings_only(),
        // ---- one file's errors do not hide the other's ----
        Case::broken(
            "errors_in_both_files_are_all_reported",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreads: many\n",
            &format!("{PATH_HEAD}        servers: [\"127.0.0.1:8000\"]\n        rate_limit: \"ten\"\n"),
            vec![
                err(M, 3, "threads", "expected a whole number"),
                err(U, 6, pk("rate_limit"), "expected a whole number, found a string `ten`"),
            ],
        ),
    ]
}
