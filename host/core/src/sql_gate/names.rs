//! The names plugin SQL may and may not use: the function allowlist, and
//! outboxd's own tables and the catalogs, which no statement reaches.

use sqlparser::ast::Ident;

/// Functions plugin SQL may call, lower case, on either database (one that
/// a database lacks fails there). Left out on purpose: anything that
/// builds a value much larger than its input (`repeat`, `lpad`, `rpad`,
/// `replace`, `zeroblob`, `randomblob`, `printf`, `format`, the string and
/// array aggregates), generates rows (`generate_series`), sleeps, reads or
/// changes settings, reads files, large objects or the network, or names
/// the catalogs (every `pg_*` function).
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    // aggregates
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "total",
    "bool_and",
    "bool_or",
    "every",
    // nulls and comparisons
    "coalesce",
    "nullif",
    "ifnull",
    "iif",
    "greatest",
    "least",
    // numbers
    "abs",
    "round",
    "floor",
    "ceil",
    "ceiling",
    "trunc",
    "mod",
    "sign",
    // text, bounded by its input
    "lower",
    "upper",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "trim",
    "ltrim",
    "rtrim",
    "btrim",
    "substr",
    "substring",
    "left",
    "right",
    "position",
    "strpos",
    "instr",
    "starts_with",
    "split_part",
    "concat",
    "md5",
    // time
    "now",
    "current_timestamp",
    "current_date",
    "current_time",
    "localtimestamp",
    "date_trunc",
    "date_part",
    "to_timestamp",
    "to_char",
    "strftime",
    "datetime",
    "date",
    "time",
    "julianday",
    "unixepoch",
    // JSON
    "json_extract",
    "json_valid",
    "json_type",
    "json_array_length",
    "jsonb_array_length",
    "json_typeof",
    "jsonb_typeof",
    "json_extract_path_text",
    "jsonb_extract_path_text",
    "jsonb_extract_path",
    "json_build_object",
    "jsonb_build_object",
    "to_json",
    "to_jsonb",
    // other
    "typeof",
    "gen_random_uuid",
];

/// Whether `name` (any case) is one of outboxd's own tables, or a name
/// reserved for them or for the databases' catalogs. Plugin SQL never
/// reaches these, and `consumers[].tables` may not list them.
pub fn is_host_table(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "outbox"
        || n == "inbox"
        || n == "outbound_calls"
        || n == "route_pauses"
        || [
            "outbox_",
            "inbox_",
            "outboxd",
            "transport_",
            "plugin",
            "consumer_",
            "pg_",
            "sqlite_",
            "information_schema",
        ]
        .iter()
        .any(|p| n.starts_with(p))
}

/// outboxd's own tables and the catalogs a plugin might aim at, by their
/// exact names: refused as tables (with every name [`is_host_table`]
/// reserves) and also as columns and aliases, so no statement that names
/// one can reach it by a door the parse did not see.
pub const HOST_NAMES: &[&str] = &[
    "outbox",
    "inbox",
    "transport_messages",
    "transport_cursors",
    "transport_members",
    "plugins",
    "plugin_activations",
    "plugin_shadow_stats",
    "consumer_dead_letters",
    "consumer_offsets",
    "outboxd_migrations",
    "outbound_calls",
    "route_pauses",
    "pg_shadow",
    "pg_authid",
    "pg_settings",
    "pg_roles",
    "pg_user",
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
];

pub(super) fn is_host_name(ident: &Ident) -> bool {
    HOST_NAMES.contains(&ident.value.to_ascii_lowercase().as_str())
}

pub fn is_allowed_function(name: &str) -> bool {
    ALLOWED_FUNCTIONS.contains(&name)
}
