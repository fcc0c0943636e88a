SELECT 'commit; drop table x' AS s, "set" FROM t -- rollback
/* c */