"""The ground: what every other package of the project stands on, importing none of them.

- `infermeter.settings`: every setting, one environment variable each, with a documented default
  (`infermeter.settings_doc` renders them as docs/settings.md and the `infermeter settings` table);
- `infermeter.credentials`: the credentials generated once per INFERMETER_HOME when none are configured;
- `infermeter.db`: the shared MetaData, the project-wide NUMERIC scale, engines and migrations;
- `infermeter.stack`: the local stack (embedded PostgreSQL, the Tansu broker) and its processes, one module per job;
- `infermeter.times`: aware UTC instants, half-open windows, hours and months, UTC text;
- `infermeter.auth`, `infermeter.http`: who is calling, and the HTTP plumbing every router shares.
"""
