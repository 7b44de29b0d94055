"""The Hugging Face Hub boundary: client glue, remote header reads, checkpoint download, publish, card, pipeline."""
