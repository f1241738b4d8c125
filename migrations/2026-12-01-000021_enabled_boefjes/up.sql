-- The boefjes each organisation had enabled when ColdStart last looked (mula's
-- `process_new_boefjes`): a boefje enabled since is planned on the objects it can scan, which
-- no event announces (Octopoes publishes a change of scan profile only). One row per
-- organisation, its boefje ids as a sorted JSON array; kept across restarts and instances, so a
-- boefje enabled while the service was stopped is still found new.
CREATE TABLE enabled_boefjes (
    organisation TEXT PRIMARY KEY NOT NULL,
    boefjes TEXT NOT NULL,
    modified_at TIMESTAMP NOT NULL
);
