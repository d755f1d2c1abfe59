"""Who may call the services, and how they prove it: TLS and the principals of an
auth file."""
