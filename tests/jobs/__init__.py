"""The score job: options, outputs, --resume, leases, trust of the folders it reads back."""
