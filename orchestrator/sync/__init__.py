"""[sync]: make every host's copy of the job's source match this machine's, over SFTP."""
