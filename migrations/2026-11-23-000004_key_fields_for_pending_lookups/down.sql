DROP INDEX ix_tasks_keys_missing;
DROP INDEX ix_tasks_pending_input_ooi;
DROP INDEX ix_tasks_pending_oci_image;
DROP INDEX ix_tasks_pending_plugin_id;
DROP INDEX ix_tasks_pending_organisation;
ALTER TABLE tasks DROP COLUMN input_ooi;
ALTER TABLE tasks DROP COLUMN oci_image;
ALTER TABLE tasks DROP COLUMN plugin_id;
