"""The results schema shared by the harness (writer), the sweeps (resume) and analysis (reader)."""
